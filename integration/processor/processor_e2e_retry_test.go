package processor_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
	"github.com/leasestore/leasestore/leasing/processor"
)

// testE2ERetries runs the failure cases: a retry after the backoff, and
// failures until a dead letter, then a requeue.
func testE2ERetries(t *testing.T, q leasing.Queue) {
	ctx := context.Background()

	t.Run("FailureThenRetryAfterBackoffThenSuccess", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		id := b.enqueueN(t, 1)[0]
		t0 := b.clock.Now()
		var calls atomic.Int32
		p := b.start(t, "a", func(context.Context, leasing.Message) error {
			if calls.Add(1) == 1 {
				return errors.New("downstream unavailable")
			}
			return nil
		}, processor.Options{RetryPolicy: processor.RetryPolicy{InitialDelay: time.Minute}})

		b.waitStatus(t, id, leasing.StatusFailed)
		r := b.row(t, id)
		require.Equal(t, "downstream unavailable", r.LastError)
		require.Equal(t, 1, r.AttemptCount)
		require.Nil(t, r.LeaseExpiresAt)
		require.Equal(t, t0.Add(time.Minute), r.VisibleAfter, "due again after the backoff, on the store's clock")

		// The processor keeps claiming, but the message is not due yet.
		b.waitFor(t, p.claimsMark()(3), "three more claims")
		require.EqualValues(t, 1, calls.Load(), "not retried before the backoff ends")
		require.Empty(t, b.rawClaim(t, "other", 10), "not visible to anyone before the backoff ends")

		b.clock.Advance(time.Minute)
		b.waitStatus(t, id, q.Succeeded())
		require.NoError(t, p.stop(t))
		r = b.row(t, id)
		require.Equal(t, 2, r.AttemptCount)
		require.Equal(t, int64(2), leasingtest.Generations(r))
		require.EqualValues(t, 2, calls.Load())
		require.Len(t, b.broker.of(id), 2, "delivered twice: the failed attempt and the retry")
		p.requireCounters(t, map[string]int64{"leases_acquired": 2, "failed": 1, "succeeded": 1})
	})

	t.Run("FailuresUntilDeadLetterThenRequeueThenSuccess", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		id := b.enqueueN(t, 1)[0]
		var calls atomic.Int32
		var poisoned atomic.Bool
		poisoned.Store(true)
		p := b.start(t, "a", func(context.Context, leasing.Message) error {
			n := calls.Add(1)
			if poisoned.Load() {
				return fmt.Errorf("poison, call %d", n)
			}
			return nil
		}, processor.Options{RetryPolicy: processor.RetryPolicy{MaxAttempts: 3, InitialDelay: time.Second, Multiplier: 2}})

		for _, step := range []struct {
			attempt int
			delay   time.Duration
		}{{1, time.Second}, {2, 2 * time.Second}} {
			b.waitFor(t, func() bool {
				r := b.peek(id)
				return r.Status == leasing.StatusFailed && r.AttemptCount == step.attempt
			}, "failed on attempt %d", step.attempt)
			r := b.row(t, id)
			require.Equal(t, fmt.Sprintf("poison, call %d", step.attempt), r.LastError)
			require.Equal(t, b.clock.Now().Add(step.delay), r.VisibleAfter, "exponential backoff")
			b.clock.Advance(step.delay)
		}
		b.waitStatus(t, id, leasing.StatusDeadLettered)
		r := b.row(t, id)
		require.Equal(t, 3, r.AttemptCount)
		require.Equal(t, "poison, call 3", r.LastError)
		require.NotNil(t, r.DeadLetteredAt)
		require.Equal(t, b.clock.Now(), *r.DeadLetteredAt)
		require.Nil(t, r.LeaseExpiresAt)

		// Dead-lettered is terminal: claims pass it by, even much later.
		b.clock.Advance(time.Hour)
		b.waitFor(t, p.claimsMark()(3), "three more claims")
		require.EqualValues(t, 3, calls.Load())
		require.Equal(t, leasing.StatusDeadLettered, b.row(t, id).Status)

		poisoned.Store(false)
		res, err := b.store.Requeue(ctx, id)
		require.NoError(t, err)
		require.Equal(t, 1, res.Requested)
		require.Equal(t, []uuid.UUID{id}, res.Requeued)
		b.waitStatus(t, id, q.Succeeded())
		require.NoError(t, p.stop(t))
		r = b.row(t, id)
		require.Equal(t, 1, r.AttemptCount, "requeue resets the attempts")
		require.Equal(t, int64(4), leasingtest.Generations(r), "the generation never resets")
		require.Empty(t, r.LastError, "requeue clears the error")
		require.Nil(t, r.DeadLetteredAt)
		require.EqualValues(t, 4, calls.Load())
		p.requireCounters(t, map[string]int64{"leases_acquired": 4, "failed": 2, "dead_lettered": 1, "succeeded": 1})
	})
}
