package failover_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/integration/internal/pgcluster"
	"github.com/leasestore/leasestore/leasing"
)

// TestFailoverAsyncLoss measures what an asynchronous failover loses on
// each queue. The standby streams through a proxy; once it replayed a
// first round of enqueues, claims and completions, the proxy black-holes
// the WAL stream and a second round runs on the primary alone, every call
// returning success. The primary then dies and the standby is promoted.
//
// The second round is lost whole, although every call of it returned
// success: the enqueues (an inbox loses messages its broker was told were
// accepted; an outbox loses them with the business rows of the same
// transaction), the completions (the messages are in flight again, under
// the lease of the first round, and are handled again once it expires)
// and the claims (the rows are pending at their old generation). The
// first round survives. A claim lost this way hands the same lease
// generation out again: when the same owner claims the message anew, the
// lease it held before the switch is the same lease, and the fence cannot
// tell them apart (docs/high-availability.md says what that costs).
func TestFailoverAsyncLoss(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := pgcluster.Start(t, pgcluster.Options{Mode: pgcluster.Async, ReplicationProxy: true})
	stores := openStores(t, c.MultiHostURL())
	repl, warnings := replicationWarnings(ctx, t, c.Primary.URL())
	require.Equal(t, int64(1), repl.Standbys)
	require.Len(t, warnings, 1, "doctor warns of an inbox on asynchronous replication")
	require.Contains(t, warnings[0], "the inbox runs on asynchronous replication")
	const firstN, secondN, claimN, completeN = 100, 50, 40, 20

	type round struct {
		acked     []uuid.UUID
		completed []uuid.UUID
	}
	var first, second [2]round // per queue, in queues' order
	held := map[leasing.Queue][]leasing.Lease{}
	for i, q := range queues {
		res, err := stores[q].Enqueue(ctx, newMessages(q, "loss", firstN)...)
		require.NoError(t, err)
		first[i].acked = res.IDs
		leases, err := stores[q].Claim(ctx, leasing.ClaimRequest{Owner: "loss-" + string(q), BatchSize: claimN, LeaseFor: time.Hour, TenantID: "loss"})
		require.NoError(t, err)
		require.Len(t, leases, claimN)
		wr, err := stores[q].Complete(ctx, leases[:completeN]...)
		require.NoError(t, err)
		require.NoError(t, wr.Err())
		for _, ls := range leases[:completeN] {
			first[i].completed = append(first[i].completed, ls.Message.ID)
		}
		held[q] = leases[completeN:]
	}
	require.NoError(t, c.WaitReplayed(ctx))

	// The WAL stream stops; the primary goes on alone.
	c.ReplicationProxy().HoldNew(true)
	c.ReplicationProxy().BlackHole()
	lostClaims := map[leasing.Queue][]leasing.Lease{}
	for i, q := range queues {
		res, err := stores[q].Enqueue(ctx, newMessages(q, "loss", secondN)...)
		require.NoError(t, err)
		second[i].acked = res.IDs
		wr, err := stores[q].Complete(ctx, held[q]...)
		require.NoError(t, err)
		require.NoError(t, wr.Err())
		for _, ls := range held[q] {
			second[i].completed = append(second[i].completed, ls.Message.ID)
		}
		leases, err := stores[q].Claim(ctx, leasing.ClaimRequest{Owner: "loss-" + string(q), BatchSize: 10, LeaseFor: time.Hour, TenantID: "loss"})
		require.NoError(t, err)
		require.Len(t, leases, 10)
		lostClaims[q] = leases
	}
	c.Failover("immediate")

	for i, q := range queues {
		rows := readRows(ctx, t, c.Standby.URL(), q)
		count := func(ids []uuid.UUID, ok func(rowState, bool) bool) int {
			n := 0
			for _, id := range ids {
				r, found := rows[id]
				if ok(r, found) {
					n++
				}
			}
			return n
		}
		missing := func(_ rowState, found bool) bool { return !found }
		notTerminal := func(r rowState, found bool) bool { return found && r.status != string(q.Succeeded()) }
		lostFirst, lostSecond := count(first[i].acked, missing), count(second[i].acked, missing)
		undoneFirst, undoneSecond := count(first[i].completed, notTerminal), count(second[i].completed, notTerminal)
		t.Logf("async %s: enqueues lost %d of %d before the stream stopped, %d of %d after; completions undone %d of %d before, %d of %d after",
			q, lostFirst, firstN, lostSecond, secondN, undoneFirst, completeN, undoneSecond, claimN-completeN)
		require.Zero(t, lostFirst)
		require.Zero(t, undoneFirst)
		require.Equal(t, secondN, lostSecond, "%s: every enqueue after the stream stopped is lost", q)
		require.Equal(t, claimN-completeN, undoneSecond, "%s: every completion after the stream stopped is undone", q)

		// The lost claims' rows are pending again at their old generation:
		// the same owner claiming again gets the very lease it held.
		// The first calls may meet connections to the dead primary
		// (ErrUnavailable); the primary is gone, so they did not commit.
		var again []leasing.Lease
		require.NoError(t, retryUnavailable(ctx, func() (err error) {
			again, err = stores[q].Claim(ctx, leasing.ClaimRequest{Owner: "loss-" + string(q), BatchSize: 10, LeaseFor: time.Hour, TenantID: "loss"})
			return err
		}))
		before := map[uuid.UUID]int64{}
		for _, ls := range lostClaims[q] {
			before[ls.Message.ID] = ls.Generation
		}
		reused := 0
		for _, ls := range again {
			if g, ok := before[ls.Message.ID]; ok && g == ls.Generation {
				reused++
			}
		}
		require.Equal(t, len(lostClaims[q]), reused, "%s: a lost claim's generation is handed out again", q)
		// So a write under the lease from before the switch is applied.
		var wr leasing.WriteResult
		require.NoError(t, retryUnavailable(ctx, func() (err error) {
			wr, err = stores[q].Complete(ctx, lostClaims[q][0])
			return err
		}))
		require.NoError(t, wr.Err(), "%s: the fence cannot tell a reused generation of the same owner apart", q)
	}
}
