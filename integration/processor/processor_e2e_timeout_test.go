package processor_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
	"github.com/leasestore/leasestore/leasing/processor"
)

// e2eHandlerTimeout is the HandlerTimeout of the timeout cases, real time:
// each hung handler waits this long before its attempt is failed. The
// calls that return at once must beat it, on a loaded machine too.
const e2eHandlerTimeout = 500 * time.Millisecond

// testE2EHandlerTimeout runs the handler timeout cases: a hung handler that
// honours its context, and one that ignores it, are failed with the
// timeout's error, retried and dead-lettered per the policy, and no longer
// renewed once their failure is written.
func testE2EHandlerTimeout(t *testing.T, q leasing.Queue) {
	ctx := context.Background()
	timedOut := fmt.Sprintf("processor: handler timed out after %s", e2eHandlerTimeout)

	t.Run("HandlerTimeout/HungHandlerFailedRetriedThenDeadLettered", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		id := b.enqueueN(t, 1)[0]
		causes := make(chan error, 2)
		a := b.start(t, "a", func(ctx context.Context, _ leasing.Message) error {
			<-ctx.Done() // hung until the processor gives up on it
			causes <- context.Cause(ctx)
			return ctx.Err()
		}, processor.Options{
			HandlerTimeout: e2eHandlerTimeout,
			RetryPolicy:    processor.RetryPolicy{MaxAttempts: 2, InitialDelay: time.Second},
		})

		cause := <-causes
		require.ErrorIs(t, cause, processor.ErrHandlerTimeout)
		require.EqualError(t, cause, timedOut)
		b.waitStatus(t, id, leasing.StatusFailed)
		r := b.row(t, id)
		require.Equal(t, timedOut, r.LastError)
		require.Equal(t, 1, r.AttemptCount)
		require.Nil(t, r.LeaseExpiresAt, "the failure ends the lease")
		require.Equal(t, b.clock.Now().Add(time.Second), r.VisibleAfter, "due again after the policy's backoff")

		b.clock.Advance(time.Second)
		require.ErrorIs(t, <-causes, processor.ErrHandlerTimeout, "the retry times out too")
		b.waitStatus(t, id, leasing.StatusDeadLettered)
		require.NoError(t, a.stop(t))
		r = b.row(t, id)
		require.Equal(t, timedOut, r.LastError)
		require.Equal(t, 2, r.AttemptCount)
		require.Equal(t, int64(2), leasingtest.Generations(r))
		require.Nil(t, r.LeaseExpiresAt)
		require.Len(t, b.broker.of(id), 2)
		a.requireCounters(t, map[string]int64{"leases_acquired": 2, "failed": 1, "dead_lettered": 1})
	})

	t.Run("HandlerTimeout/IgnoredContextFailedAtTimeoutAndNotRenewed", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		ids := b.enqueueN(t, 2)
		hung, next := ids[0], ids[1]
		release := make(chan struct{})
		unblock := sync.OnceFunc(func() { close(release) })
		// One slot and a batch of two: next waits, leased and renewed, while
		// the hung handler keeps the slot.
		a := b.start(t, "a", func(_ context.Context, m leasing.Message) error {
			if m.ID == hung {
				<-release // ignores its context
			}
			return nil
		}, processor.Options{
			HandlerTimeout: e2eHandlerTimeout, Concurrency: 1, BatchSize: 2,
			RetryPolicy: processor.RetryPolicy{InitialDelay: 10 * time.Second},
		})
		t.Cleanup(unblock) // runs before a's stop, should the test fail

		b.waitStatus(t, hung, leasing.StatusFailed)
		r := b.row(t, hung)
		require.Equal(t, timedOut, r.LastError)
		require.Nil(t, r.LeaseExpiresAt, "written failed while the handler still runs")
		require.Equal(t, q.InFlight(), b.row(t, next).Status, "next still waits for the slot")

		// The heartbeat goes on renewing next, and never hung again (one
		// renew may have been on its way when the failure was written).
		calls, carried := a.store.renewCounts(hung)
		b.waitFor(t, func() bool { c, _ := a.store.renewCounts(hung); return c >= calls+3 }, "three more renews")
		calls, settled := a.store.renewCounts(hung)
		require.LessOrEqual(t, settled, carried+1)
		b.waitFor(t, func() bool { c, _ := a.store.renewCounts(hung); return c >= calls+3 }, "three more renews")
		_, carriedLater := a.store.renewCounts(hung)
		require.Equal(t, settled, carriedLater, "hung's lease is no longer renewed")
		_, nextRenewed := a.store.renewCounts(next)
		require.Greater(t, nextRenewed, 0)

		// Retried: after the backoff another worker claims it and finishes
		// it, although a's handler still runs.
		b.clock.Advance(10 * time.Second)
		other := b.rawClaim(t, "other", 10)
		require.Len(t, other, 1)
		require.Equal(t, hung, other[0].Message.ID)
		require.Equal(t, 2, other[0].Attempt)
		res, err := b.store.Complete(ctx, other[0])
		require.NoError(t, err)
		require.Equal(t, leasing.OutcomeApplied, res.Outcomes[0].Outcome)

		unblock() // a's handler returns nil late: not written
		b.waitStatus(t, next, q.Succeeded())
		require.NoError(t, a.stop(t))
		r = b.row(t, hung)
		require.Equal(t, q.Succeeded(), r.Status)
		require.Equal(t, "other", r.LeaseOwner, "finished by the other worker's lease")
		require.Equal(t, int64(2), leasingtest.Generations(r))
		// A second write of a's attempt would count persist_rejected (the
		// fence refuses generation 1) or a second succeeded.
		a.requireCounters(t, map[string]int64{"leases_acquired": 2, "failed": 1, "succeeded": 1})
	})
}
