package processor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// testHeartbeat: renewing the held leases, and losing them.
func testHeartbeat(t *testing.T) {
	t.Run("Heartbeat/KeepsSlowHandlerAlive", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		id := b.enqueue(t, 1)[0]
		t0 := b.clock.Now()
		started, release := make(chan struct{}), make(chan struct{})
		proc := b.start(t, nil, func(ctx context.Context, _ leasing.Lease) error {
			close(started)
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}, processor.Options{LeaseDuration: 30 * time.Second})
		<-started
		require.Equal(t, t0.Add(30*time.Second), *b.row(t, id).LeaseExpiresAt)

		// Two steps of 20s take the store clock past the first expiry; the
		// heartbeat renews to store-now + 30s after each step.
		for _, now := range []time.Time{t0.Add(20 * time.Second), t0.Add(40 * time.Second)} {
			b.clock.Advance(20 * time.Second)
			waitFor(t, func() bool {
				exp := b.peek(id).LeaseExpiresAt
				return exp != nil && exp.Equal(now.Add(30*time.Second))
			}, "renewed")
			require.Empty(t, b.claimAsOther(t), "a renewed lease is not reclaimed")
		}
		st, err := b.mem.Stats(context.Background())
		require.NoError(t, err)
		require.Zero(t, st.ExpiredLeases)

		close(release)
		waitFor(t, statusIs(b.mem, id, leasing.StatusCompleted), "completed")
		r := b.row(t, id)
		require.Equal(t, int64(1), r.LeaseGeneration, "never reclaimed")
		require.NoError(t, proc.stop(t)) // Run returns once every outcome is written and counted
		b.requireCounters(t, map[string]int64{"processor.lease_lost": 0, "processor.succeeded": 1})
	})

	t.Run("Heartbeat/RenewsAllLeasesInOneCall", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		b.enqueue(t, 4)
		var sawAll atomic.Bool
		store := &storeHooks{Store: b.mem}
		store.renew = func(ctx context.Context, d time.Duration, leases ...leasing.Lease) (leasing.RenewResult, error) {
			if len(leases) == 4 {
				sawAll.Store(true)
			}
			return b.mem.Renew(ctx, d, leases...)
		}
		release := make(chan struct{})
		var started atomic.Int32
		// Two slots, a batch of four: two leases run, two wait, and one
		// renew call carries all four.
		b.start(t, store, func(context.Context, leasing.Lease) error {
			started.Add(1)
			<-release
			return nil
		}, processor.Options{Concurrency: 2, BatchSize: 4})
		waitFor(t, sawAll.Load, "one renew carries running and waiting leases")
		require.EqualValues(t, 2, started.Load())
		close(release)
		waitFor(t, func() bool { return b.counter("processor.succeeded") == 4 }, "all succeeded")
	})

	t.Run("Heartbeat/LostLeaseCancelsHandlerAndSkipsOutcome", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		id := b.enqueue(t, 1)[0]
		started, release := make(chan struct{}), make(chan struct{})
		cause := make(chan error, 1)
		// One slot: the processor cannot claim (and so reclaim the row
		// itself) while its handler runs.
		b.start(t, nil, func(ctx context.Context, _ leasing.Lease) error {
			close(started)
			<-ctx.Done()
			cause <- context.Cause(ctx)
			<-release
			return nil // claims success; the processor must not write it
		}, processor.Options{Concurrency: 1, LeaseDuration: 30 * time.Second})
		<-started

		b.clock.Advance(31 * time.Second)
		reclaimed := b.claimAsOther(t)
		require.Len(t, reclaimed, 1)
		require.Equal(t, int64(2), reclaimed[0].Generation)

		select {
		case err := <-cause:
			require.ErrorIs(t, err, leasing.ErrLeaseLost)
		case <-time.After(5 * time.Second):
			t.Fatal("handler context not cancelled after its lease was lost")
		}
		close(release)
		waitFor(t, func() bool { return b.counter("processor.persist_skipped") == 1 }, "skipped")

		r := b.row(t, id)
		require.Equal(t, leasing.StatusProcessing, r.Status, "not completed by the worker that lost the lease")
		require.Equal(t, "other", r.LeaseOwner)
		b.requireCounters(t, map[string]int64{
			"processor.lease_lost": 1, "processor.persist_skipped": 1, "processor.succeeded": 0, "processor.persist_rejected": 0,
		})
		wr, err := b.mem.Complete(context.Background(), reclaimed...)
		require.NoError(t, err)
		require.NoError(t, wr.Err(), "the new owner finishes the message")
	})

	t.Run("Heartbeat/LeaseLostWhileWaitingNeverStarts", func(t *testing.T) {
		t.Parallel()
		b := setupProcessor(t, leasing.Inbox)
		ids := b.enqueue(t, 2)
		release := make(chan struct{})
		var calls atomic.Int32
		b.start(t, nil, func(ctx context.Context, _ leasing.Lease) error {
			calls.Add(1)
			<-ctx.Done()
			<-release
			return ctx.Err()
		}, processor.Options{Concurrency: 1, BatchSize: 2})
		waitFor(t, func() bool { return calls.Load() == 1 && b.counter("processor.leases_acquired") == 2 }, "one runs, one waits")

		b.clock.Advance(31 * time.Second)
		require.Len(t, b.claimAsOther(t), 2)
		waitFor(t, func() bool { return b.counter("processor.lease_lost") == 2 }, "both leases lost")
		close(release)
		waitFor(t, func() bool { return b.counter("processor.persist_skipped") == 2 }, "both skipped")
		require.EqualValues(t, 1, calls.Load(), "the waiting lease was lost before it started")
		for _, id := range ids {
			r := b.row(t, id)
			require.Equal(t, leasing.StatusProcessing, r.Status)
			require.Equal(t, "other", r.LeaseOwner)
		}
	})
}
