package processor_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
	"github.com/leasestore/leasestore/leasing/processor"
)

// testE2ELeaseLoss runs the lease cases: a worker that dies mid-lease, the
// heartbeat that keeps a slow handler's lease, a renewal that fails, and
// the fence that refuses a write after a reclaim.
func testE2ELeaseLoss(t *testing.T, q leasing.Queue) {
	ctx := context.Background()

	t.Run("WorkerDiesMidLeaseThenReclaimAfterExpiry", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		id := b.enqueueN(t, 1)[0]
		started := make(chan struct{})
		// a takes the message, then its process "dies": from then on every
		// store call it makes fails, so it never renews or writes again.
		a := b.start(t, "a", func(ctx context.Context, _ leasing.Message) error {
			close(started)
			<-ctx.Done()
			return context.Cause(ctx)
		}, processor.Options{Concurrency: 1, BatchSize: 1, ShutdownGrace: 10 * time.Millisecond})
		<-started
		a.store.crashed.Store(true)
		r := b.row(t, id)
		require.Equal(t, q.InFlight(), r.Status)
		require.Equal(t, a.p.Owner(), r.LeaseOwner)
		require.Equal(t, b.clock.Now().Add(30*time.Second), *r.LeaseExpiresAt)

		bp := b.start(t, "b", e2eOK, processor.Options{})
		b.waitFor(t, bp.claimsMark()(3), "b claims three times")
		require.Empty(t, b.broker.of(id)[1:], "b leaves a live lease alone")

		b.clock.Advance(31 * time.Second) // past a's lease
		b.waitStatus(t, id, q.Succeeded())
		r = b.row(t, id)
		require.Equal(t, bp.p.Owner(), r.LeaseOwner, "b reclaimed and finished it")
		require.Equal(t, int64(2), leasingtest.Generations(r))
		require.Equal(t, 2, r.AttemptCount, "the lost attempt counts")

		// Stopping a cancels its handler; its failed write never reaches
		// the database (it gives up after its retries).
		require.NoError(t, a.stop(t))
		require.NoError(t, bp.stop(t))
		require.Equal(t, q.Succeeded(), b.row(t, id).Status)
		deliveries := b.broker.of(id)
		require.Len(t, deliveries, 2)
		require.Equal(t, []string{"a", "b"}, []string{deliveries[0].Proc, deliveries[1].Proc})
		a.requireCounters(t, map[string]int64{"leases_acquired": 1})
		bp.requireCounters(t, map[string]int64{"leases_acquired": 1, "succeeded": 1})
	})

	t.Run("HeartbeatKeepsSlowHandlerFromReclaim", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		id := b.enqueueN(t, 1)[0]
		t0 := b.clock.Now()
		started, release := make(chan struct{}), make(chan struct{})
		a := b.start(t, "a", func(ctx context.Context, _ leasing.Message) error {
			close(started)
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}, processor.Options{})
		<-started
		require.Equal(t, t0.Add(30*time.Second), *b.row(t, id).LeaseExpiresAt)
		bp := b.start(t, "b", e2eOK, processor.Options{})

		// Step the store clock 20s at a time, 100s in all, more than three
		// leases. Each step leaves the lease live (20s < 30s); the
		// heartbeat then renews it to store-now + 30s before the next step,
		// and b, claiming all along, finds nothing due. One step of more
		// than the lease would instead race the heartbeat against b.
		for step := range 5 {
			b.clock.Advance(20 * time.Second)
			now := b.clock.Now()
			b.waitFor(t, func() bool {
				exp := b.peek(id).LeaseExpiresAt
				return exp != nil && exp.Equal(now.Add(30*time.Second))
			}, "renewed after step %d", step)
			b.waitFor(t, bp.claimsMark()(2), "b claims twice after step %d", step)
		}
		require.Len(t, b.broker.all(), 1, "b never got the message")
		st, err := b.store.Stats(ctx)
		require.NoError(t, err)
		require.Zero(t, st.ExpiredLeases)

		close(release)
		b.waitStatus(t, id, q.Succeeded())
		require.NoError(t, a.stop(t))
		require.NoError(t, bp.stop(t))
		r := b.row(t, id)
		require.Equal(t, a.p.Owner(), r.LeaseOwner)
		require.Equal(t, int64(1), leasingtest.Generations(r), "never reclaimed")
		require.Equal(t, 1, r.AttemptCount)
		a.requireCounters(t, map[string]int64{"leases_acquired": 1, "succeeded": 1})
		bp.requireCounters(t, map[string]int64{})
	})

	t.Run("RenewalFailureCancelsHandlerAndMessageIsRetried", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		id := b.enqueueN(t, 1)[0]
		started, release := make(chan struct{}), make(chan struct{})
		cause := make(chan error, 1)
		// One slot, held until release even after the cancel: a cannot
		// claim the message back itself, so someone else must retry it.
		a := b.start(t, "a", func(ctx context.Context, _ leasing.Message) error {
			close(started)
			<-ctx.Done()
			cause <- context.Cause(ctx)
			<-release
			return nil // claims success; a must not write it
		}, processor.Options{Concurrency: 1})
		<-started
		bp := b.start(t, "b", e2eOK, processor.Options{})

		// The store clock jumps past the lease before a's heartbeat renews
		// it (a stalled heartbeat, a paused VM): the next renew is refused.
		b.clock.Advance(31 * time.Second)
		select {
		case err := <-cause:
			require.ErrorIs(t, err, leasing.ErrLeaseLost)
		case <-time.After(e2eWait):
			t.Fatal("handler context not cancelled after its lease was lost")
		}
		b.waitStatus(t, id, q.Succeeded())
		require.Equal(t, bp.p.Owner(), b.row(t, id).LeaseOwner, "b retried and finished it")

		close(release)
		b.waitFor(t, func() bool { return a.counter("persist_skipped") == 1 }, "a skips its outcome")
		require.NoError(t, a.stop(t))
		require.NoError(t, bp.stop(t))
		r := b.row(t, id)
		require.Equal(t, q.Succeeded(), r.Status)
		require.Equal(t, bp.p.Owner(), r.LeaseOwner)
		require.Equal(t, int64(2), leasingtest.Generations(r))
		require.Equal(t, 2, r.AttemptCount)
		a.requireCounters(t, map[string]int64{"leases_acquired": 1, "lease_lost": 1, "persist_skipped": 1})
		bp.requireCounters(t, map[string]int64{"leases_acquired": 1, "succeeded": 1})
	})

	t.Run("FenceRefusesWriteAfterReclaim", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		id := b.enqueueN(t, 1)[0]
		started, release := make(chan struct{}), make(chan struct{})
		// The heartbeat never ticks during the case, so a does not learn
		// that its lease expired and was reclaimed before it writes.
		a := b.start(t, "a", func(context.Context, leasing.Message) error {
			close(started)
			<-release
			return nil
		}, processor.Options{Concurrency: 1, HeartbeatInterval: 15 * time.Second})
		<-started
		b.clock.Advance(31 * time.Second)
		other := b.rawClaim(t, "other", 10)
		require.Len(t, other, 1)
		require.Equal(t, int64(2), leasingtest.Generations(b.row(t, id)), "a claimed, other reclaimed")
		require.Equal(t, b.row(t, id).LeaseGeneration, other[0].Generation)

		close(release)
		b.waitFor(t, func() bool { return a.counter("persist_rejected") == 1 }, "a's success write refused")
		r := b.row(t, id)
		require.Equal(t, q.InFlight(), r.Status, "a's late success did not finish the message")
		require.Equal(t, "other", r.LeaseOwner)
		require.Equal(t, int64(2), leasingtest.Generations(r))
		wr, err := b.store.Complete(ctx, other...)
		require.NoError(t, err)
		require.NoError(t, wr.Err(), "the new owner finishes it")
		require.NoError(t, a.stop(t))
		a.requireCounters(t, map[string]int64{"leases_acquired": 1, "persist_rejected": 1})
	})
}
