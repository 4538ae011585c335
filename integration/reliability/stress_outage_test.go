package reliability_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
	"github.com/leasestore/leasestore/leasing/processor"
)

// TestStressOutageHour (long form: -stress or LEASESTORE_STRESS=1) is the
// hour-long broker outage at the default RetryPolicy and BreakerPolicy, on
// a Memory store whose clock the test moves one second per millisecond:
// the hour takes seconds. Two relays: one whose handler returns plain
// errors, one that says processor.Unavailable. Neither dead-letters
// anything, each key reaches the broker in enqueue order once it is back,
// and the figures (handler calls during the outage, attempts spent) are
// logged for docs/notes/2026-12-03-outage.md. PollInterval is 1 ms, only
// because the processor's own timers run on the real clock while the
// store's runs an hour in seconds.
func TestStressOutageHour(t *testing.T) {
	if !long() {
		t.Skip("long form only (-stress or LEASESTORE_STRESS=1)")
	}
	t.Parallel()
	for _, unavailable := range []bool{false, true} {
		t.Run(fmt.Sprintf("unavailable=%v", unavailable), func(t *testing.T) {
			t.Parallel()
			clock := leasingtest.NewClock(leasingtest.Start)
			store, err := leasing.NewMemory(leasing.Outbox, leasing.MemoryOptions{Now: clock.Now})
			require.NoError(t, err)
			ctx := context.Background()
			const keys, perKey = 4, 25
			var msgs []leasing.NewMessage
			for i := range perKey {
				for k := range keys {
					msgs = append(msgs, leasing.NewMessage{Topic: "orders", OrderingKey: fmt.Sprintf("k%d", k), Payload: fmt.Appendf(nil, "%d", i)})
				}
				msgs = append(msgs, leasing.NewMessage{Topic: "orders", Payload: fmt.Appendf(nil, "%d", i)})
			}
			_, err = store.Enqueue(ctx, msgs...)
			require.NoError(t, err)

			var down atomic.Bool
			down.Store(true)
			var calls atomic.Int64
			var mu sync.Mutex
			accepted := map[string][]int{}
			publish := processor.Publisher(func(_ context.Context, m leasing.Message) error {
				if down.Load() {
					calls.Add(1)
					err := errors.New("broker: connection refused")
					if unavailable {
						return processor.Unavailable(err)
					}
					return err
				}
				var seq int
				_, _ = fmt.Sscanf(string(m.Payload), "%d", &seq)
				mu.Lock()
				defer mu.Unlock()
				accepted[m.OrderingKey] = append(accepted[m.OrderingKey], seq)
				return nil
			})
			p, err := processor.New(store, publish.Handler(), processor.Options{PollInterval: time.Millisecond})
			require.NoError(t, err)
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- p.Run(runCtx) }()
			defer func() {
				stop()
				require.NoError(t, <-done)
			}()

			start := time.Now()
			for range 3600 { // one hour of the store's clock, a second per millisecond
				clock.Advance(time.Second)
				time.Sleep(time.Millisecond)
			}
			outageCalls := calls.Load()
			st, err := store.Stats(ctx)
			require.NoError(t, err)
			require.Zero(t, st.Depth[leasing.StatusDeadLettered], "nothing dead-lettered during the hour")
			down.Store(false)
			recovered := time.Now()
			require.Eventually(t, func() bool {
				clock.Advance(time.Second) // the retries' backoff, 5 min at most, passes on the store's clock
				st, err := store.Stats(ctx)
				require.NoError(t, err)
				return st.Depth[leasing.StatusPublished] == int64(len(msgs))
			}, 2*time.Minute, time.Millisecond, "the backlog drains once the broker is back")
			st, err = store.Stats(ctx)
			require.NoError(t, err)
			require.Zero(t, st.Depth[leasing.StatusDeadLettered])

			mu.Lock()
			defer mu.Unlock()
			for k := range keys {
				got := accepted[fmt.Sprintf("k%d", k)]
				require.Len(t, got, perKey)
				for i, seq := range got {
					require.Equal(t, i, seq, "key k%d in enqueue order", k)
				}
			}
			maxAttempt := 0
			for _, r := range store.Rows() {
				maxAttempt = max(maxAttempt, r.AttemptCount)
			}
			require.LessOrEqual(t, maxAttempt, processor.DefaultMaxAttempts)
			t.Logf("stress outage: unavailable=%v: %d messages, 1 h outage in %s: %d handler calls during it, at most %d attempts per message (default MaxAttempts %d), drained in %s of the store's clock steps, 0 dead-lettered",
				unavailable, len(msgs), recovered.Sub(start).Round(time.Millisecond), outageCalls, maxAttempt,
				processor.DefaultMaxAttempts, time.Since(recovered).Round(time.Millisecond))
		})
	}
}
