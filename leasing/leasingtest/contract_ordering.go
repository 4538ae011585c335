package leasingtest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/leasestore/leasestore/leasing"
	"github.com/stretchr/testify/require"
)

// strictSetter is the strict-ordering switch both stores offer beside Store.
type strictSetter interface {
	SetStrictOrdering(ctx context.Context, strict bool) error
}

// deadLetterer is the operator's dead-letter both stores offer beside Store.
type deadLetterer interface {
	DeadLetterByID(ctx context.Context, r leasing.DeadLetterByIDRequest) (leasing.Attempt, error)
}

// keyed returns n messages of ordering key key (tenant tenant), in order.
func keyed(tenant, key string, n int) []leasing.NewMessage {
	msgs := make([]leasing.NewMessage, n)
	for i := range msgs {
		msgs[i] = leasing.NewMessage{Payload: []byte(key), TenantID: tenant, OrderingKey: key}
	}
	return msgs
}

// orderingCases are the cases of ordering keys: one head per key, what
// holds a key and what frees it, strict mode, tenants and duplicates.
var orderingCases = []contractCase{
	{"Ordering/OneHeadPerKeyInEnqueueOrder", func(t *testing.T, b *bundle) {
		// One clock reading for all: created_at is equal within each key,
		// and the order is the enqueue order all the same.
		a := b.enqueue(keyed("", "a", 3)...)
		bb := b.enqueue(keyed("", "b", 1)...)
		u := b.enqueue(leasing.NewMessage{Payload: []byte("u")})
		a = append(a, b.enqueue(keyed("", "a", 1)...)...)
		require.Equal(t, leasing.StatusWaiting, b.get(a[1]).Status)
		require.Equal(t, []int64{1, 2, 3, 4}, []int64{b.get(a[0]).KeySeq, b.get(a[1]).KeySeq, b.get(a[2]).KeySeq, b.get(a[3]).KeySeq})
		require.Zero(t, b.get(u[0]).KeySeq)

		first := b.claim("w", 10)
		require.ElementsMatch(t, []uuid.UUID{a[0], bb[0], u[0]}, idsOf(first), "one message per key, and the unordered one")
		require.Empty(t, b.claim("w", 10), "the rest of a waits behind its head")
		for i := 1; i < len(a); i++ {
			var head leasing.Lease
			for _, l := range first {
				if l.Message.ID == a[i-1] {
					head = l
				}
			}
			res, err := b.store.Complete(b.ctx, head)
			require.NoError(t, err)
			require.NoError(t, res.Err())
			first = b.claim("w", 10)
			require.Equal(t, []uuid.UUID{a[i]}, idsOf(first), "completing the head promotes the next")
			require.Equal(t, "a", first[0].Message.OrderingKey)
		}
		res, err := b.store.Complete(b.ctx, first[0])
		require.NoError(t, err)
		require.NoError(t, res.Err())
		st, err := b.store.Stats(b.ctx)
		require.NoError(t, err)
		require.Zero(t, st.Depth[leasing.StatusWaiting])
	}},
	{"Ordering/FailureReleaseAndExpiryHoldTheKey", func(t *testing.T, b *bundle) {
		ids := b.enqueue(keyed("", "k", 2)...)
		l := b.claim("w", 10)
		require.Equal(t, []uuid.UUID{ids[0]}, idsOf(l))
		res, err := b.store.Fail(b.ctx, leasing.Failure{Lease: l[0], RetryAfter: time.Minute, Error: "boom"})
		require.NoError(t, err)
		require.NoError(t, res.Err())
		require.Empty(t, b.claim("w", 10), "a head waiting out its backoff holds its key")
		b.env.Clock.Advance(time.Minute)
		l = b.claim("w", 10)
		require.Equal(t, []uuid.UUID{ids[0]}, idsOf(l), "the failed head is retried first")

		res, err = b.store.Release(b.ctx, l[0])
		require.NoError(t, err)
		require.NoError(t, res.Err())
		l = b.claim("w", 10)
		require.Equal(t, []uuid.UUID{ids[0]}, idsOf(l), "a released head holds its key")

		res, err = b.store.ReleaseAfter(b.ctx, leasing.Failure{Lease: l[0], RetryAfter: time.Minute, Error: "down"})
		require.NoError(t, err)
		require.NoError(t, res.Err())
		require.Empty(t, b.claim("w", 10), "a head released for a minute holds its key")
		b.env.Clock.Advance(time.Minute)
		l = b.claim("w", 10)
		require.Equal(t, []uuid.UUID{ids[0]}, idsOf(l), "the head released for a minute is claimed first")

		b.env.Clock.Advance(lease)
		re := b.claim("x", 10)
		require.Equal(t, []uuid.UUID{ids[0]}, idsOf(re), "an expired head is reclaimed before the next of its key")
		res, err = b.store.Complete(b.ctx, l[0])
		require.NoError(t, err)
		require.Equal(t, []leasing.Outcome{leasing.OutcomeLost}, outcomes(res))
		require.Empty(t, b.claim("w", 10), "a lost write frees nothing")
		res, err = b.store.Complete(b.ctx, re[0])
		require.NoError(t, err)
		require.NoError(t, res.Err())
		require.Equal(t, []uuid.UUID{ids[1]}, idsOf(b.claim("w", 10)))
	}},
	{"Ordering/CompleteAndClaimTakesThePromoted", func(t *testing.T, b *bundle) {
		ids := b.enqueue(keyed("", "k", 2)...)
		l := b.claim("w", 1)
		res, next, err := b.completeAndClaim(l, leasing.ClaimRequest{Owner: "w", BatchSize: 5, LeaseFor: lease})
		require.NoError(t, err)
		require.NoError(t, res.Err())
		require.Equal(t, []uuid.UUID{ids[1]}, idsOf(next))
	}},
	{"Ordering/TenantsScopeKeys", func(t *testing.T, b *bundle) {
		t1 := b.enqueue(keyed("t1", "k", 2)...)
		t2 := b.enqueue(keyed("t2", "k", 2)...)
		require.ElementsMatch(t, []uuid.UUID{t1[0], t2[0]}, idsOf(b.claim("w", 10)), "the same key in two tenants is two keys")
		l, err := b.store.Claim(b.ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 10, LeaseFor: lease, TenantID: "t1"})
		require.NoError(t, err)
		require.Empty(t, l)
	}},
	{"Ordering/DeadLetterFreesTheKeyAndRequeueRejoinsAtTheTail", func(t *testing.T, b *bundle) {
		ids := b.enqueue(keyed("", "k", 3)...)
		l := b.claim("w", 10)
		res, err := b.store.DeadLetter(b.ctx, leasing.Failure{Lease: l[0], Error: "poison"})
		require.NoError(t, err)
		require.NoError(t, res.Err())
		l = b.claim("w", 10)
		require.Equal(t, []uuid.UUID{ids[1]}, idsOf(l), "by default a dead-lettered head frees its key")

		rq, err := b.store.Requeue(b.ctx, ids[0])
		require.NoError(t, err)
		require.Equal(t, []uuid.UUID{ids[0]}, rq.Requeued)
		row := b.get(ids[0])
		require.Equal(t, leasing.StatusWaiting, row.Status, "a requeued dead letter rejoins its key's line")
		require.Greater(t, row.KeySeq, b.get(ids[2]).KeySeq, "at the tail")
		for _, want := range []uuid.UUID{ids[2], ids[0]} {
			res, err := b.store.Complete(b.ctx, l[0])
			require.NoError(t, err)
			require.NoError(t, res.Err())
			l = b.claim("w", 10)
			require.Equal(t, []uuid.UUID{want}, idsOf(l))
		}
	}},
	{"Ordering/StrictDeadLetterKeepsTheKey", func(t *testing.T, b *bundle) {
		require.NoError(t, b.store.(strictSetter).SetStrictOrdering(b.ctx, true))
		ids := b.enqueue(keyed("", "k", 2)...)
		l := b.claim("w", 10)
		res, err := b.store.DeadLetter(b.ctx, leasing.Failure{Lease: l[0], Error: "poison"})
		require.NoError(t, err)
		require.NoError(t, res.Err())
		require.Empty(t, b.claim("w", 10), "in strict mode a dead-lettered head keeps its key")
		st, err := b.store.Stats(b.ctx)
		require.NoError(t, err)
		require.NotNil(t, st.WaitingHead)
		require.Equal(t, ids[0], st.WaitingHead.MessageID)

		_, err = b.store.Requeue(b.ctx, ids[0])
		require.NoError(t, err)
		require.Equal(t, leasing.StatusPending, b.get(ids[0]).Status, "requeued, it is its key's head again")
		l = b.claim("w", 10)
		require.Equal(t, []uuid.UUID{ids[0]}, idsOf(l))
		_, err = b.store.DeadLetter(b.ctx, leasing.Failure{Lease: l[0], Error: "again"})
		require.NoError(t, err)

		b.env.Clock.Advance(time.Hour)
		n, err := b.store.Purge(b.ctx, leasing.PurgeRequest{OlderThan: time.Minute, BatchSize: 10})
		require.NoError(t, err)
		require.Zero(t, n, "dead letters are kept by default")
		n, err = b.store.Purge(b.ctx, leasing.PurgeRequest{OlderThan: time.Minute, BatchSize: 10, IncludeDeadLettered: true})
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, []uuid.UUID{ids[1]}, idsOf(b.claim("w", 10)), "purging the blocking head promotes the next")
	}},
	{"Ordering/StrictOffFreesTheKeysItHeld", func(t *testing.T, b *bundle) {
		strict := b.store.(strictSetter)
		require.NoError(t, strict.SetStrictOrdering(b.ctx, true))
		ids := b.enqueue(keyed("", "k", 2)...)
		other := b.enqueue(keyed("", "j", 1)...)
		l := b.claim("w", 10)
		require.Equal(t, []uuid.UUID{ids[0], other[0]}, idsOf(l))
		res, err := b.store.DeadLetter(b.ctx, leasing.Failure{Lease: l[0], Error: "poison"})
		require.NoError(t, err)
		require.NoError(t, res.Err())
		require.Empty(t, b.claim("w", 10), "strict mode holds the key")
		// A stale write naming the dead letter changes nothing.
		res, err = b.store.Complete(b.ctx, l[0])
		require.NoError(t, err)
		require.ErrorIs(t, res.Err(), leasing.ErrAlreadyTerminal)
		require.Equal(t, leasing.StatusWaiting, b.get(ids[1]).Status)

		require.NoError(t, strict.SetStrictOrdering(b.ctx, false))
		require.Equal(t, leasing.StatusPending, b.get(ids[1]).Status, "turning strict mode off frees the key")
		require.Equal(t, []uuid.UUID{ids[1]}, idsOf(b.claim("w", 10)))
		require.Equal(t, leasing.StatusDeadLettered, b.get(ids[0]).Status)
	}},
	{"Ordering/StaleLeaseOfAPurgedIncarnationIsLost", func(t *testing.T, b *bundle) {
		// A message id enqueued again after a purge starts its lease
		// generations above the purged row's, so a lease of the purged row
		// fails the new row's fence even when an owner of the same name
		// claimed the new row: its write is lost, and the new row and its
		// key stay with the new lease.
		writes := map[string]func(old leasing.Lease) (leasing.WriteResult, error){
			"complete": func(old leasing.Lease) (leasing.WriteResult, error) { return b.store.Complete(b.ctx, old) },
			"dead-letter": func(old leasing.Lease) (leasing.WriteResult, error) {
				return b.store.DeadLetter(b.ctx, leasing.Failure{Lease: old, Error: "stale"})
			},
			"release": func(old leasing.Lease) (leasing.WriteResult, error) { return b.store.Release(b.ctx, old) },
			"complete and claim": func(old leasing.Lease) (leasing.WriteResult, error) {
				r := leasing.ClaimRequest{Owner: "w", BatchSize: 1, LeaseFor: lease, Topics: []string{"none"}}
				res, _, err := b.completeAndClaim([]leasing.Lease{old}, r)
				return res, err
			},
		}
		for name, write := range writes {
			id := uuid.New()
			b.enqueue(leasing.NewMessage{ID: id, Payload: []byte(name)})
			old := b.claim("w", 10)
			require.Equal(t, []uuid.UUID{id}, idsOf(old))
			res, err := b.store.Complete(b.ctx, old[0])
			require.NoError(t, err)
			require.NoError(t, res.Err())
			b.env.Clock.Advance(time.Hour)
			_, err = b.store.Purge(b.ctx, leasing.PurgeRequest{OlderThan: time.Minute, BatchSize: 10})
			require.NoError(t, err)
			_, err = b.store.Get(b.ctx, id)
			require.ErrorIs(t, err, leasing.ErrNotFound)

			ids := b.enqueue(leasing.NewMessage{ID: id, Payload: []byte(name), OrderingKey: name}, leasing.NewMessage{Payload: []byte(name), OrderingKey: name})
			l := b.claim("w", 10)
			require.Equal(t, []uuid.UUID{id}, idsOf(l))
			require.Greater(t, l[0].Generation, old[0].Generation, "a new row's generations start above the purged row's")
			res, err = write(old[0])
			require.NoError(t, err, name)
			require.ErrorIs(t, res.Err(), leasing.ErrLeaseLost, name)
			row := b.get(id)
			require.Equal(t, b.q.InFlight(), row.Status, "%s: the new row stays leased", name)
			require.Equal(t, l[0].Generation, row.LeaseGeneration, name)
			require.Empty(t, b.claim("w", 10), "%s: the key stays with the new row", name)
			res, err = b.store.Complete(b.ctx, l...)
			require.NoError(t, err)
			require.NoError(t, res.Err())
			next := b.claim("w", 10)
			require.Equal(t, []uuid.UUID{ids[1]}, idsOf(next), "%s: the new row's completion frees its key", name)
			res, err = b.store.Complete(b.ctx, next...)
			require.NoError(t, err)
			require.NoError(t, res.Err())
		}
	}},
	{"Ordering/DeadLetterByIDOfHeadAndOfWaiting", func(t *testing.T, b *bundle) {
		ids := b.enqueue(keyed("", "k", 3)...)
		op := b.store.(deadLetterer)
		_, err := op.DeadLetterByID(b.ctx, leasing.DeadLetterByIDRequest{ID: ids[1], Reason: "skip it"})
		require.NoError(t, err)
		_, err = op.DeadLetterByID(b.ctx, leasing.DeadLetterByIDRequest{ID: ids[0], Reason: "and the head"})
		require.NoError(t, err)
		require.Equal(t, []uuid.UUID{ids[2]}, idsOf(b.claim("w", 10)), "the waiting one left the line; the head freed the key")
	}},
	{"Ordering/StatsCountWaitingAndTheOldestHead", func(t *testing.T, b *bundle) {
		ids := b.enqueue(keyed("", "old", 3)...)
		b.env.Clock.Advance(time.Second)
		b.enqueue(keyed("", "new", 2)...)
		b.enqueue(keyed("", "alone", 1)...)
		b.env.Clock.Advance(time.Second)
		st, err := b.store.Stats(b.ctx)
		require.NoError(t, err)
		require.Equal(t, int64(3), st.Depth[leasing.StatusWaiting])
		require.Equal(t, int64(3), st.Depth[leasing.StatusPending])
		require.Equal(t, &leasing.WaitingHead{OrderingKey: "old", MessageID: ids[0], Age: 2 * time.Second}, st.WaitingHead)
		require.Equal(t, 2*time.Second, st.OldestHeadAge())
	}},
	{"Ordering/InboxDuplicateOfAnotherKeyIsRefused", func(t *testing.T, b *bundle) {
		if b.q != leasing.Inbox {
			t.Skip("outbox duplicates fail with ErrDuplicate whatever their key")
		}
		id := uuid.New()
		b.enqueue(leasing.NewMessage{ID: id, Payload: []byte("p"), OrderingKey: "a"})
		b.enqueue(leasing.NewMessage{Payload: []byte("p"), IdempotencyKey: "i", OrderingKey: "a"})
		other := uuid.New()
		for _, dup := range []leasing.NewMessage{
			{ID: id, Payload: []byte("p"), OrderingKey: "b"},
			{Payload: []byte("p"), IdempotencyKey: "i", OrderingKey: "b"},
		} {
			_, err := b.store.Enqueue(b.ctx, leasing.NewMessage{ID: other, Payload: []byte("p"), OrderingKey: "c"}, dup)
			var conflict *leasing.OrderingKeyConflictError
			require.ErrorAs(t, err, &conflict)
			require.ErrorIs(t, err, leasing.ErrOrderingKeyConflict)
			_, err = b.store.Get(b.ctx, other)
			require.ErrorIs(t, err, leasing.ErrNotFound, "nothing of the call was inserted")
		}
		// The same key, or none, is a duplicate as ever.
		for _, dup := range []leasing.NewMessage{
			{ID: id, Payload: []byte("p"), OrderingKey: "a"},
			{ID: id, Payload: []byte("p")},
		} {
			res, err := b.store.Enqueue(b.ctx, dup)
			require.NoError(t, err)
			require.Equal(t, []leasing.Duplicate{{Index: 0, ID: id}}, res.Duplicates)
		}
		require.Equal(t, int64(1), b.get(id).KeySeq)
	}},
	{"Ordering/BadKeysRejectedAndNothingChanged", func(t *testing.T, b *bundle) {
		for _, key := range []string{"a\x00b", "\xff\xfe", strings.Repeat("k", leasing.MaxOrderingKeyBytes+1)} {
			_, err := b.store.Enqueue(b.ctx, leasing.NewMessage{Payload: []byte("ok")}, leasing.NewMessage{Payload: []byte("p"), OrderingKey: key})
			var arg *leasing.ArgumentError
			require.ErrorAs(t, err, &arg)
			require.Equal(t, "ordering key", arg.Field)
		}
		if b.q == leasing.Inbox {
			_, err := b.store.Enqueue(b.ctx,
				leasing.NewMessage{Payload: []byte("p"), IdempotencyKey: "i", OrderingKey: "a"},
				leasing.NewMessage{Payload: []byte("p"), IdempotencyKey: "i", OrderingKey: "b"})
			require.ErrorIs(t, err, leasing.ErrInvalidArgument, "one idempotency key with two ordering keys in one call")
		}
		b.enqueue(leasing.NewMessage{Payload: []byte("p"), OrderingKey: strings.Repeat("k", leasing.MaxOrderingKeyBytes)})
		st, err := b.store.Stats(b.ctx)
		require.NoError(t, err)
		require.Equal(t, int64(1), st.Depth[leasing.StatusPending], "only the last, valid call inserted")
	}},
}
