package leasingtest

import (
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/leasestore/leasestore/leasing"
	"github.com/stretchr/testify/require"
)

// queueCases are the cases of the operations on a queue's rows at large:
// requeue of dead letters, stats, purge.
var queueCases = []contractCase{
	{"DeadLetter/ThenRequeue", func(t *testing.T, b *bundle) {
		ids := b.enqueueN(2)
		l := b.claim("a", 1)[0]
		res, err := b.store.DeadLetter(b.ctx, leasing.Failure{Lease: l, Error: "poison"})
		require.NoError(t, err)
		require.NoError(t, res.Err())
		row := b.get(ids[0])
		require.Equal(t, leasing.StatusDeadLettered, row.Status)
		require.NotNil(t, row.DeadLetteredAt)
		require.Equal(t, "poison", row.LastError)
		require.Equal(t, []uuid.UUID{ids[1]}, idsOf(b.claim("a", 10)), "dead letters are never claimed")

		rq, err := b.store.Requeue(b.ctx, ids[0], ids[1], uuid.New())
		require.NoError(t, err)
		require.Equal(t, 3, rq.Requested)
		require.Equal(t, []uuid.UUID{ids[0]}, rq.Requeued, "only dead-lettered rows change")
		row = b.get(ids[0])
		require.Equal(t, leasing.StatusPending, row.Status)
		require.Equal(t, 0, row.AttemptCount)
		require.Empty(t, row.LastError)
		require.Empty(t, row.LeaseOwner)
		require.Nil(t, row.DeadLetteredAt)
		require.Equal(t, b.q.InFlight(), b.get(ids[1]).Status)
		again := b.claim("a", 1)
		require.Equal(t, []uuid.UUID{ids[0]}, idsOf(again))
		require.Equal(t, 1, again[0].Attempt)
	}},
	{"Requeue/All", func(t *testing.T, b *bundle) {
		b.enqueueN(3)
		ls := b.claim("a", 3)
		var fs []leasing.Failure
		for _, l := range ls[:2] {
			fs = append(fs, leasing.Failure{Lease: l, Error: "x"})
		}
		_, err := b.store.DeadLetter(b.ctx, fs...)
		require.NoError(t, err)
		rq, err := b.store.RequeueAll(b.ctx)
		require.NoError(t, err)
		require.Equal(t, 2, rq.Requested)
		require.ElementsMatch(t, idsOf(ls[:2]), rq.Requeued)
		st, err := b.store.Stats(b.ctx)
		require.NoError(t, err)
		require.Equal(t, int64(2), st.Depth[leasing.StatusPending])
		require.Equal(t, int64(0), st.Depth[leasing.StatusDeadLettered])
	}},
	{"Stats/DepthAndLeaseHealth", func(t *testing.T, b *bundle) {
		b.enqueueN(5)
		b.enqueue(leasing.NewMessage{Delay: time.Hour})
		ls := b.claim("a", 3)
		_, err := b.store.Complete(b.ctx, ls[0])
		require.NoError(t, err)
		_, err = b.store.DeadLetter(b.ctx, leasing.Failure{Lease: ls[1]})
		require.NoError(t, err)
		b.env.Clock.Advance(lease)
		st, err := b.store.Stats(b.ctx)
		require.NoError(t, err)
		require.Equal(t, map[leasing.Status]int64{
			leasing.StatusPending: 3, b.q.InFlight(): 1, b.q.Succeeded(): 1,
			leasing.StatusFailed: 0, leasing.StatusDeadLettered: 1, leasing.StatusWaiting: 0,
		}, st.Depth)
		require.Equal(t, int64(1), st.ExpiredLeases)
		// The oldest due row is the expired lease's message, created at Start+2ms.
		require.Equal(t, b.env.Clock.Now().Sub(ls[2].Message.CreatedAt), st.OldestDueAge)
	}},
	{"Purge/TerminalRowsByFinishTime", func(t *testing.T, b *bundle) {
		b.enqueueN(4)
		ls := b.claim("a", 3)
		_, err := b.store.Complete(b.ctx, ls[0])
		require.NoError(t, err)
		_, err = b.store.DeadLetter(b.ctx, leasing.Failure{Lease: ls[1]})
		require.NoError(t, err)
		b.env.Clock.Advance(time.Hour)
		_, err = b.store.Complete(b.ctx, ls[2]) // finished recently: kept
		require.NoError(t, err)
		n, err := b.store.Purge(b.ctx, leasing.PurgeRequest{OlderThan: 30 * time.Minute, BatchSize: 10})
		require.NoError(t, err)
		require.Equal(t, 1, n)
		_, err = b.store.Get(b.ctx, ls[0].Message.ID)
		require.ErrorIs(t, err, leasing.ErrNotFound)
		n, err = b.store.Purge(b.ctx, leasing.PurgeRequest{OlderThan: 30 * time.Minute, BatchSize: 10, IncludeDeadLettered: true})
		require.NoError(t, err)
		require.Equal(t, 1, n)
		st, err := b.store.Stats(b.ctx)
		require.NoError(t, err)
		require.Equal(t, int64(1), st.Depth[leasing.StatusPending])
		require.Equal(t, int64(1), st.Depth[b.q.Succeeded()])
	}},
	{"Purge/OldestFirstFinishedBeforeDeadLetters", func(t *testing.T, b *bundle) {
		// Finished and dead-lettered a minute apart each, alternating, so
		// that no map or id order matches the finish order by chance.
		b.enqueueN(12)
		ls := b.claim("a", 12)
		var finished, dead []uuid.UUID
		for i, l := range ls {
			var err error
			if i%3 == 2 {
				_, err = b.store.DeadLetter(b.ctx, leasing.Failure{Lease: l})
				dead = append(dead, l.Message.ID)
			} else {
				_, err = b.store.Complete(b.ctx, l)
				finished = append(finished, l.Message.ID)
			}
			require.NoError(t, err)
			b.env.Clock.Advance(time.Minute)
		}
		b.env.Clock.Advance(time.Hour)
		// The four oldest finished rows, then (with dead letters) the other
		// four, then the four dead letters, oldest first.
		want := slices.Concat(finished, dead)
		purged := 0
		for _, n := range []int{4, 5, 3} {
			got, err := b.store.Purge(b.ctx, leasing.PurgeRequest{OlderThan: time.Minute, BatchSize: n, IncludeDeadLettered: purged > 0})
			require.NoError(t, err)
			require.Equal(t, n, got)
			purged += n
			for i, id := range want {
				_, err := b.store.Get(b.ctx, id)
				if i < purged {
					require.ErrorIs(t, err, leasing.ErrNotFound, "row %d of the purge order", i)
				} else {
					require.NoError(t, err, "row %d of the purge order", i)
				}
			}
		}
	}},
}
