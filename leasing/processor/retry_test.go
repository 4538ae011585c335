package processor_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing/processor"
)

func TestRetryPolicy(t *testing.T) {
	t.Parallel()

	t.Run("Backoff/ExponentialThenCapped", func(t *testing.T) {
		t.Parallel()
		p := processor.RetryPolicy{} // 1s doubling, capped at 5m
		want := []time.Duration{
			time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second,
			32 * time.Second, 64 * time.Second, 128 * time.Second, 256 * time.Second, 5 * time.Minute, 5 * time.Minute,
		}
		for i, d := range want {
			require.Equal(t, d, p.Backoff(i+1), "attempt %d", i+1)
		}
		require.Equal(t, 5*time.Minute, p.Backoff(1_000_000), "no overflow")
		require.Equal(t, time.Second, p.Backoff(0), "attempt below 1 counts as 1")
	})

	t.Run("Backoff/Multiplier", func(t *testing.T) {
		t.Parallel()
		p := processor.RetryPolicy{InitialDelay: 100 * time.Millisecond, Multiplier: 1.5, MaxDelay: time.Second}
		require.Equal(t, 100*time.Millisecond, p.Backoff(1))
		require.Equal(t, 150*time.Millisecond, p.Backoff(2))
		require.Equal(t, 225*time.Millisecond, p.Backoff(3))
		require.Equal(t, time.Second, p.Backoff(10))
	})

	t.Run("Backoff/FixedWithMultiplierOne", func(t *testing.T) {
		t.Parallel()
		p := processor.RetryPolicy{InitialDelay: 7 * time.Second, Multiplier: 1}
		for attempt := 1; attempt < 20; attempt++ {
			require.Equal(t, 7*time.Second, p.Backoff(attempt))
		}
	})

	t.Run("Backoff/JitterShortensWithinBounds", func(t *testing.T) {
		t.Parallel()
		p := processor.RetryPolicy{InitialDelay: time.Second, MaxDelay: 10 * time.Second, Jitter: 0.25}
		for _, attempt := range []int{1, 3, 10} {
			full := processor.RetryPolicy{InitialDelay: time.Second, MaxDelay: 10 * time.Second}.Backoff(attempt)
			low := full - full/4
			seen := map[time.Duration]bool{}
			for range 1000 {
				d := p.Backoff(attempt)
				require.GreaterOrEqual(t, d, low, "attempt %d", attempt)
				require.LessOrEqual(t, d, full, "attempt %d: jitter never exceeds the cap", attempt)
				seen[d] = true
			}
			require.Greater(t, len(seen), 100, "delays are spread")
		}
	})

	t.Run("DeadLetters", func(t *testing.T) {
		t.Parallel()
		p := processor.RetryPolicy{MaxAttempts: 3}
		require.False(t, p.DeadLetters(2))
		require.True(t, p.DeadLetters(3))
		require.True(t, p.DeadLetters(4))
		require.True(t, processor.RetryPolicy{}.DeadLetters(24), "default 24 attempts")
		require.False(t, processor.RetryPolicy{}.DeadLetters(23))
	})

	// The default policy rides out a one-hour outage of a handler's
	// destination with plain errors: its retries span more than an hour
	// before the last attempt, which alone dead-letters.
	t.Run("DefaultsOutlastAnHour", func(t *testing.T) {
		t.Parallel()
		var p processor.RetryPolicy
		var span time.Duration
		for attempt := 1; !p.DeadLetters(attempt); attempt++ {
			span += p.Backoff(attempt)
		}
		require.Equal(t, 4711*time.Second, span)
		require.Greater(t, span, time.Hour)
	})
}
