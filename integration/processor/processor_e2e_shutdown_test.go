package processor_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
	"github.com/leasestore/leasestore/leasing/processor"
)

// testE2EShutdown runs the graceful-shutdown case.
func testE2EShutdown(t *testing.T, q leasing.Queue) {
	t.Run("ShutdownReleasesUnstartedLeasesAtOnce", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		ids := b.enqueueN(t, 3)
		started, release := make(chan struct{}), make(chan struct{})
		a := b.start(t, "a", func(context.Context, leasing.Message) error {
			close(started)
			<-release
			return nil
		}, processor.Options{Concurrency: 1, BatchSize: 5, ShutdownGrace: e2eWait})
		<-started
		b.waitFor(t, func() bool { return a.counter("leases_acquired") == 3 }, "a claims all three")
		for _, id := range ids[1:] {
			r := b.row(t, id)
			require.Equal(t, q.InFlight(), r.Status, "waiting for a slot, yet leased")
			require.Equal(t, 1, r.AttemptCount)
		}

		stopped := make(chan error, 1)
		go func() { stopped <- a.p.Stop(context.Background()) }()
		// a's running handler still holds its slot; the two leases whose
		// handler never started are released at once, not at expiry.
		for _, id := range ids[1:] {
			b.waitStatus(t, id, leasing.StatusPending)
			r := b.row(t, id)
			require.Zero(t, r.AttemptCount, "a release gives the attempt back")
			require.Empty(t, r.LeaseOwner)
			require.Nil(t, r.LeaseExpiresAt)
		}
		// The store clock never moves: b takes them over without waiting
		// for any lease to expire, while a is still shutting down.
		bp := b.start(t, "b", e2eOK, processor.Options{})
		for _, id := range ids[1:] {
			b.waitStatus(t, id, q.Succeeded())
		}
		select {
		case err := <-stopped:
			t.Fatalf("a stopped (%v) before its running handler returned", err)
		default:
		}
		close(release)
		require.NoError(t, <-stopped)
		require.NoError(t, a.stop(t))
		require.NoError(t, bp.stop(t))

		r := b.row(t, ids[0])
		require.Equal(t, q.Succeeded(), r.Status, "a's running handler finished within the grace period")
		require.Equal(t, a.p.Owner(), r.LeaseOwner)
		for _, id := range ids[1:] {
			r := b.row(t, id)
			require.Equal(t, bp.p.Owner(), r.LeaseOwner)
			require.Equal(t, 1, r.AttemptCount, "the release burned no attempt")
			require.Equal(t, int64(2), leasingtest.Generations(r))
			require.Len(t, b.broker.of(id), 1, "never delivered by a")
		}
		a.requireCounters(t, map[string]int64{"leases_acquired": 3, "succeeded": 1})
		bp.requireCounters(t, map[string]int64{"leases_acquired": 2, "succeeded": 2})
	})
}
