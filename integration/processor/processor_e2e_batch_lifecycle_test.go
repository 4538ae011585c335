package processor_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
	"github.com/leasestore/leasestore/leasing/processor"
)

// testE2EBatchLifecycle runs the batch form's handler timeout, shutdown and
// heartbeat cases: each acts on the whole call and on every lease of it.
func testE2EBatchLifecycle(t *testing.T, q leasing.Queue) {
	ctx := context.Background()
	const n = 3

	t.Run("Batch/HandlerTimeoutFailsEveryLeaseAtOnceLateReturnNotWritten", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		ids := b.enqueueN(t, n)
		release := make(chan struct{})
		unblock := sync.OnceFunc(func() { close(release) })
		cause := make(chan error, 1)
		var once sync.Once
		broker := &e2eBatchBroker{log: b.broker}
		// The first call hangs, ignoring its context, then claims success
		// for every message; the retry's call succeeds at once. One slot:
		// the hung call keeps it.
		a := b.newBatchProc(t, "a", broker, func(ctx context.Context, _ leasing.Message) error {
			once.Do(func() {
				<-release
				cause <- context.Cause(ctx)
			})
			return nil
		}, processor.Options{
			BatchSize: e2eBrokerLimit, Concurrency: 1, HandlerTimeout: e2eHandlerTimeout,
			RetryPolicy: processor.RetryPolicy{InitialDelay: 10 * time.Second},
		})
		t.Cleanup(unblock) // runs before a's stop, should the test fail
		a.run()

		timedOut := "processor: handler timed out after " + e2eHandlerTimeout.String()
		for _, id := range ids {
			b.waitStatus(t, id, leasing.StatusFailed)
		}
		for _, id := range ids {
			r := b.row(t, id)
			require.Equal(t, timedOut, r.LastError, "every lease of the call failed with the timeout")
			require.Equal(t, 1, r.AttemptCount)
			require.Nil(t, r.LeaseExpiresAt, "written while the call still runs")
			require.Equal(t, b.clock.Now().Add(10*time.Second), r.VisibleAfter, "due again after the policy's backoff")
		}
		unblock() // the call returns success for all, late: not written
		require.ErrorIs(t, <-cause, processor.ErrHandlerTimeout)
		b.waitFor(t, func() bool { return a.counter("failed") == n }, "the failures counted")
		for _, id := range ids {
			require.Equal(t, leasing.StatusFailed, b.row(t, id).Status, "the late success is not written")
		}
		// The retry's call writes them.
		b.clock.Advance(10 * time.Second)
		for _, id := range ids {
			b.waitStatus(t, id, q.Succeeded())
		}
		require.NoError(t, a.stop(t))
		for _, id := range ids {
			r := b.row(t, id)
			require.Equal(t, 2, r.AttemptCount)
			require.Equal(t, int64(2), leasingtest.Generations(r))
			require.Len(t, b.broker.of(id), 2)
		}
		// A write of the late success would count persist_rejected (the
		// fence refuses generation 1) or three more succeeded.
		a.requireCounters(t, map[string]int64{"leases_acquired": 2 * n, "failed": n, "succeeded": n})
	})

	t.Run("Batch/ShutdownCancelsAfterGraceFailsEveryLeaseWithoutDelay", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		ids := b.enqueueN(t, n)
		started := make(chan struct{})
		cause := make(chan error, 1)
		var once sync.Once
		broker := &e2eBatchBroker{log: b.broker}
		const grace = 50 * time.Millisecond
		// The call waits for its context; every message then reports the
		// context's error. MaxAttempts 1: any other failure would
		// dead-letter, a shutdown's does not.
		a := b.newBatchProc(t, "a", broker, func(ctx context.Context, _ leasing.Message) error {
			once.Do(func() {
				close(started)
				<-ctx.Done()
				cause <- context.Cause(ctx)
			})
			return ctx.Err()
		}, processor.Options{
			BatchSize: e2eBrokerLimit, ShutdownGrace: grace,
			RetryPolicy: processor.RetryPolicy{MaxAttempts: 1, InitialDelay: 10 * time.Second},
		})
		a.run()
		<-started
		require.NoError(t, a.p.Stop(ctx), "Stop returns once the call returned and its outcomes are written")
		require.ErrorIs(t, <-cause, processor.ErrShutdown, "cancelled after the grace")
		for _, id := range ids {
			r := b.row(t, id)
			require.Equal(t, leasing.StatusFailed, r.Status, "a shutdown never dead-letters")
			require.Equal(t, "processor: shut down: context canceled", r.LastError)
			require.Equal(t, b.clock.Now(), r.VisibleAfter, "due again at once, no backoff")
			require.Equal(t, 1, r.AttemptCount, "the attempt counts")
			require.Nil(t, r.LeaseExpiresAt)
		}
		a.requireCounters(t, map[string]int64{"leases_acquired": n, "failed": n})
	})

	t.Run("Batch/HeartbeatRenewsEveryLeaseOfALongCall", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		ids := b.enqueueN(t, n)
		started, release := make(chan struct{}), make(chan struct{})
		ctxErr := make(chan error, 1)
		var once sync.Once
		broker := &e2eBatchBroker{log: b.broker}
		a := b.newBatchProc(t, "a", broker, func(ctx context.Context, _ leasing.Message) error {
			once.Do(func() {
				close(started)
				select {
				case <-release:
				case <-ctx.Done():
				}
				ctxErr <- context.Cause(ctx)
			})
			return nil
		}, processor.Options{BatchSize: e2eBrokerLimit})
		a.run()
		<-started
		t0 := b.clock.Now()
		for _, id := range ids {
			require.Equal(t, t0.Add(30*time.Second), *b.row(t, id).LeaseExpiresAt)
		}
		// Step the store clock 20s at a time, 100s in all, more than three
		// lease durations (see HeartbeatKeepsSlowHandlerFromReclaim): after
		// each step the heartbeat renews every lease of the call to
		// store-now + 30s, and a claim finds none of them due.
		for step := range 5 {
			b.clock.Advance(20 * time.Second)
			now := b.clock.Now()
			b.waitFor(t, func() bool {
				for _, id := range ids {
					if exp := b.peek(id).LeaseExpiresAt; exp == nil || !exp.Equal(now.Add(30*time.Second)) {
						return false
					}
				}
				return true
			}, "every lease renewed after step %d", step)
			require.Empty(t, b.rawClaim(t, "other", 10), "step %d: no lease of the call is due", step)
		}
		close(release)
		require.NoError(t, <-ctxErr, "the call was never cancelled")
		for _, id := range ids {
			b.waitStatus(t, id, q.Succeeded())
		}
		require.NoError(t, a.stop(t))
		for _, id := range ids {
			r := b.row(t, id)
			require.Equal(t, a.p.Owner(), r.LeaseOwner)
			require.Equal(t, int64(1), leasingtest.Generations(r), "never reclaimed")
			require.Len(t, b.broker.of(id), 1)
		}
		require.Equal(t, int64(1), broker.calls.Load(), "one call for the three")
		a.requireCounters(t, map[string]int64{"leases_acquired": n, "succeeded": n})
	})
}
