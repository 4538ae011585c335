package leasingtest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/leasestore/leasestore/leasing"
	"github.com/stretchr/testify/require"
)

// OperatorStore is the operator's dead-letter that Postgres and Memory
// offer beside the Store contract. Contract cases of it run when the store
// under test implements it.
type OperatorStore interface {
	DeadLetterByID(ctx context.Context, r leasing.DeadLetterByIDRequest) (leasing.Attempt, error)
}

// operator returns b's store as an OperatorStore, or skips the case.
func (b *bundle) operator() OperatorStore {
	b.t.Helper()
	op, ok := b.store.(OperatorStore)
	if !ok {
		b.t.Skip("the store has no DeadLetterByID")
	}
	return op
}

// at returns a pointer to t, for the ClaimedAt of expected entries.
func at(t time.Time) *time.Time { return &t }

// historyCases are the cases of the attempt history: retried writes decided
// from it, its contents and its bound, and the operator's dead-letter.
var historyCases = []contractCase{
	{"History/RetryAfterLaterLeaseWroteIsAlreadyApplied", func(t *testing.T, b *bundle) {
		// The first write committed, its reply was lost, and before the
		// retry a later lease claimed the row and wrote an outcome of its
		// own: the retry is still already applied, and changes nothing.
		later := []struct {
			name  string
			write func(l leasing.Lease) (leasing.WriteResult, error)
		}{
			{"Fail", func(l leasing.Lease) (leasing.WriteResult, error) {
				return b.store.Fail(b.ctx, leasing.Failure{Lease: l, Error: "later"})
			}},
			{"Release", func(l leasing.Lease) (leasing.WriteResult, error) { return b.store.Release(b.ctx, l) }},
		}
		for _, w := range writes {
			if w.name == "Complete" {
				continue // nothing claims a completed row again
			}
			for _, lw := range later {
				id := b.enqueueN(1)[0]
				first := b.claim("a", 1)[0]
				res, err := w.do(b, first)
				require.NoError(t, err)
				require.Equal(t, []leasing.Outcome{leasing.OutcomeApplied}, outcomes(res), w.name)
				if w.name == "DeadLetter" {
					_, err := b.store.Requeue(b.ctx, id)
					require.NoError(t, err)
				}
				b.env.Clock.Advance(time.Second) // past Fail's retry delay
				next := b.claim("b", 1)
				require.Equal(t, []uuid.UUID{id}, idsOf(next), "%s then %s", w.name, lw.name)
				res, err = lw.write(next[0])
				require.NoError(t, err)
				require.NoError(t, res.Err())
				before := b.get(id)

				again, err := w.do(b, first)
				require.NoError(t, err)
				require.Equal(t, []leasing.Outcome{leasing.OutcomeAlreadyApplied}, outcomes(again),
					"retried %s after a later lease's %s", w.name, lw.name)
				require.NoError(t, again.Err())
				require.Equal(t, before, b.get(id), "the retry changed nothing")
				if lw.name == "Fail" {
					b.env.Clock.Advance(time.Second)
				}
				settle, err := b.store.Complete(b.ctx, b.claim("c", 1)...)
				require.NoError(t, err)
				require.NoError(t, settle.Err())
			}
		}
	}},
	{"History/OtherOutcomeOfTheLeaseIsStillLost", func(t *testing.T, b *bundle) {
		// The history answers "did this lease write this outcome", not "did
		// this lease write": a Release retried by a lease that failed is lost.
		b.enqueueN(1)
		first := b.claim("a", 1)[0]
		_, err := b.store.Fail(b.ctx, leasing.Failure{Lease: first, Error: "boom"})
		require.NoError(t, err)
		b.claim("b", 1) // due at once: retry delay 0
		for _, w := range writes {
			if w.name == "Fail" {
				continue
			}
			res, err := w.do(b, first)
			require.NoError(t, err, w.name)
			require.Equal(t, []leasing.Outcome{leasing.OutcomeLost}, outcomes(res), w.name)
		}
	}},
	{"History/Contents", func(t *testing.T, b *bundle) {
		// claim, fail, reclaim after expiry, dead-letter, requeue, complete.
		id := b.enqueueN(1)[0]
		t1 := b.env.Clock.Now()
		l1 := b.claim("a", 1)[0]
		b.env.Clock.Advance(time.Second)
		t2 := b.env.Clock.Now()
		res, err := b.store.Fail(b.ctx, leasing.Failure{Lease: l1, RetryAfter: time.Second, Error: "boom"})
		require.NoError(t, err)
		require.NoError(t, res.Err())
		b.env.Clock.Advance(time.Second)
		t3 := b.env.Clock.Now()
		l2 := b.claim("b", 1)[0]
		b.env.Clock.Advance(lease + time.Second) // b's lease expires unfinished
		t4 := b.env.Clock.Now()
		l3 := b.claim("c", 1)[0]
		require.Equal(t, 3, l3.Attempt)
		b.env.Clock.Advance(time.Second)
		t5 := b.env.Clock.Now()
		long := strings.Repeat("x", leasing.MaxAttemptErrorBytes+100)
		res, err = b.store.DeadLetter(b.ctx, leasing.Failure{Lease: l3, Error: long})
		require.NoError(t, err)
		require.NoError(t, res.Err())
		want := []leasing.Attempt{
			{Attempt: 1, Generation: l1.Generation, Owner: "a", ClaimedAt: at(t1), FinishedAt: t2, End: leasing.AttemptFailed, Error: "boom"},
			{Attempt: 2, Generation: l2.Generation, Owner: "b", ClaimedAt: at(t3), FinishedAt: l2.ExpiresAt, End: leasing.AttemptExpired},
			{Attempt: 3, Generation: l3.Generation, Owner: "c", ClaimedAt: at(t4), FinishedAt: t5, End: leasing.AttemptDeadLettered,
				Error: long[:leasing.MaxAttemptErrorBytes]},
		}
		row := b.get(id)
		require.Equal(t, want, row.Attempts)
		require.Equal(t, long, row.LastError, "last_error keeps the whole text")

		b.env.Clock.Advance(time.Second)
		t6 := b.env.Clock.Now()
		_, err = b.store.Requeue(b.ctx, id)
		require.NoError(t, err)
		l4 := b.claim("d", 1)[0]
		require.Equal(t, 1, l4.Attempt)
		res, err = b.store.Complete(b.ctx, l4)
		require.NoError(t, err)
		require.NoError(t, res.Err())
		want = append(want,
			leasing.Attempt{Attempt: 3, FinishedAt: t6, End: leasing.AttemptRequeued, Operator: true},
			leasing.Attempt{Attempt: 1, Generation: l4.Generation, Owner: "d", ClaimedAt: at(t6), FinishedAt: t6,
				End: leasing.AttemptEnd(b.q.Succeeded())},
		)
		require.Equal(t, want, b.get(id).Attempts)
	}},
	{"History/FreshRowIsEmptyNotNil", func(t *testing.T, b *bundle) {
		id := b.enqueueN(1)[0]
		require.NotNil(t, b.get(id).Attempts)
		require.Empty(t, b.get(id).Attempts)
		b.claim("a", 1)
		require.Empty(t, b.get(id).Attempts, "the attempt in flight is not in the history yet")
	}},
	{"History/ReleaseAndOrphansRecorded", func(t *testing.T, b *bundle) {
		ids := b.enqueueN(2)
		ls := b.claim("a", 2)
		_, err := b.store.Release(b.ctx, ls[0])
		require.NoError(t, err)
		released, err := b.store.ReleaseOrphans(b.ctx, "a", nil)
		require.NoError(t, err)
		require.Equal(t, []uuid.UUID{ids[1]}, released)
		now := b.env.Clock.Now()
		for i, id := range ids {
			require.Equal(t, []leasing.Attempt{{Attempt: 1, Generation: ls[i].Generation, Owner: "a", ClaimedAt: at(now),
				FinishedAt: now, End: leasing.AttemptReleased}}, b.get(id).Attempts)
		}
		// The orphaned lease's Release retry is already applied, as before.
		res, err := b.store.Release(b.ctx, ls[1])
		require.NoError(t, err)
		require.Equal(t, []leasing.Outcome{leasing.OutcomeAlreadyApplied}, outcomes(res))
	}},
	{"History/BoundedAtLimit", func(t *testing.T, b *bundle) {
		id := b.enqueueN(1)[0]
		const n = leasing.AttemptHistoryLimit + 5
		var leases []leasing.Lease
		for range n {
			l := b.claim("a", 1)[0]
			res, err := b.store.Release(b.ctx, l)
			require.NoError(t, err)
			require.NoError(t, res.Err())
			leases = append(leases, l)
			b.env.Clock.Advance(time.Millisecond)
		}
		history := b.get(id).Attempts
		require.Len(t, history, leasing.AttemptHistoryLimit)
		for i, a := range history {
			require.Equal(t, leases[n-leasing.AttemptHistoryLimit+i].Generation, a.Generation, "entry %d: oldest first, oldest dropped", i)
		}
		kept, err := b.store.Release(b.ctx, leases[n-leasing.AttemptHistoryLimit])
		require.NoError(t, err)
		require.Equal(t, []leasing.Outcome{leasing.OutcomeAlreadyApplied}, outcomes(kept), "the oldest entry kept")
		dropped, err := b.store.Release(b.ctx, leases[0])
		require.NoError(t, err)
		require.Equal(t, []leasing.Outcome{leasing.OutcomeLost}, outcomes(dropped), "beyond the bound a retry is lost")
	}},
	{"DeadLetterByID/RefusedUnderLiveLease", func(t *testing.T, b *bundle) {
		op := b.operator()
		id := b.enqueueN(1)[0]
		l := b.claim("a", 1)[0]
		before := b.get(id)
		_, err := op.DeadLetterByID(b.ctx, leasing.DeadLetterByIDRequest{ID: id, Reason: "poison"})
		require.ErrorIs(t, err, leasing.ErrLeaseHeld)
		var held *leasing.LeaseHeldError
		require.True(t, errors.As(err, &held))
		require.Equal(t, "a", held.Owner)
		require.Equal(t, l.ExpiresAt, held.ExpiresAt)
		require.Equal(t, before, b.get(id), "nothing changed")
		res, err := b.store.Complete(b.ctx, l)
		require.NoError(t, err)
		require.NoError(t, res.Err(), "the holder still finishes")
	}},
	{"DeadLetterByID/ForcedFencesTheHolder", func(t *testing.T, b *bundle) {
		op := b.operator()
		id := b.enqueueN(1)[0]
		claimed := b.env.Clock.Now()
		l := b.claim("a", 1)[0]
		b.env.Clock.Advance(time.Second)
		now := b.env.Clock.Now()
		a, err := op.DeadLetterByID(b.ctx, leasing.DeadLetterByIDRequest{ID: id, Reason: "stuck handler", Force: true})
		require.NoError(t, err)
		want := leasing.Attempt{Attempt: 1, Generation: l.Generation, Owner: "a", ClaimedAt: at(claimed), FinishedAt: now,
			End: leasing.AttemptDeadLettered, Error: "stuck handler", Operator: true, Forced: true}
		require.Equal(t, want, a)
		row := b.get(id)
		require.Equal(t, leasing.StatusDeadLettered, row.Status)
		require.Equal(t, "stuck handler", row.LastError)
		require.Equal(t, now, *row.DeadLetteredAt)
		require.Nil(t, row.LeaseExpiresAt)
		require.Empty(t, row.LeaseOwner)
		require.Equal(t, l.Generation+1, row.LeaseGeneration, "the holder's lease is fenced")
		require.Equal(t, []leasing.Attempt{want}, row.Attempts)

		renew, err := b.store.Renew(b.ctx, lease, l)
		require.NoError(t, err)
		require.Equal(t, []uuid.UUID{id}, renew.Lost)
		for _, w := range writes {
			res, err := w.do(b, l)
			require.NoError(t, err, w.name)
			require.Equal(t, []leasing.Outcome{leasing.OutcomeTerminal}, outcomes(res), "%s of the fenced holder", w.name)
		}
		// Requeued, the message is claimed under a new generation and the
		// old lease stays fenced.
		_, err = b.store.Requeue(b.ctx, id)
		require.NoError(t, err)
		next := b.claim("b", 1)[0]
		require.Equal(t, l.Generation+2, next.Generation)
		res, err := b.store.Complete(b.ctx, l)
		require.NoError(t, err)
		require.Equal(t, []leasing.Outcome{leasing.OutcomeLost}, outcomes(res))
	}},
	{"DeadLetterByID/ExpiredLeaseNeedsNoForce", func(t *testing.T, b *bundle) {
		op := b.operator()
		id := b.enqueueN(1)[0]
		claimed := b.env.Clock.Now()
		l := b.claim("a", 1)[0]
		b.env.Clock.Advance(lease)
		a, err := op.DeadLetterByID(b.ctx, leasing.DeadLetterByIDRequest{ID: id, Reason: "r"})
		require.NoError(t, err)
		require.Equal(t, leasing.Attempt{Attempt: 1, Generation: l.Generation, Owner: "a", ClaimedAt: at(claimed),
			FinishedAt: b.env.Clock.Now(), End: leasing.AttemptDeadLettered, Error: "r", Operator: true}, a)
		res, err := b.store.DeadLetter(b.ctx, leasing.Failure{Lease: l, Error: "r"})
		require.NoError(t, err)
		require.Equal(t, []leasing.Outcome{leasing.OutcomeTerminal}, outcomes(res), "an operator's entry is never the lease's")
	}},
	{"DeadLetterByID/PendingAndFailedRows", func(t *testing.T, b *bundle) {
		op := b.operator()
		ids := b.enqueueN(2)
		l := b.claim("a", 1)[0]
		_, err := b.store.Fail(b.ctx, leasing.Failure{Lease: l, RetryAfter: time.Hour, Error: "boom"})
		require.NoError(t, err)
		now := b.env.Clock.Now()
		for i, id := range ids {
			a, err := op.DeadLetterByID(b.ctx, leasing.DeadLetterByIDRequest{ID: id, Reason: "by hand"})
			require.NoError(t, err)
			want := leasing.Attempt{Attempt: 1 - i, FinishedAt: now, End: leasing.AttemptDeadLettered, Error: "by hand", Operator: true}
			require.Equal(t, want, a, "row %d", i)
			row := b.get(id)
			require.Equal(t, leasing.StatusDeadLettered, row.Status)
			require.Equal(t, want, row.Attempts[len(row.Attempts)-1])
		}
		require.Equal(t, l.Generation, b.get(ids[0]).LeaseGeneration, "no lease to fence")
		res, err := b.store.DeadLetter(b.ctx, leasing.Failure{Lease: l, Error: "boom"})
		require.NoError(t, err)
		require.Equal(t, []leasing.Outcome{leasing.OutcomeTerminal}, outcomes(res))
	}},
	{"DeadLetterByID/Refusals", func(t *testing.T, b *bundle) {
		op := b.operator()
		ids := b.enqueueN(2)
		ls := b.claim("a", 2)
		_, err := b.store.Complete(b.ctx, ls[0])
		require.NoError(t, err)
		_, err = b.store.DeadLetter(b.ctx, leasing.Failure{Lease: ls[1], Error: "x"})
		require.NoError(t, err)
		for _, id := range ids {
			before := b.get(id)
			for _, force := range []bool{false, true} {
				_, err := op.DeadLetterByID(b.ctx, leasing.DeadLetterByIDRequest{ID: id, Reason: "r", Force: force})
				require.ErrorIs(t, err, leasing.ErrAlreadyTerminal)
			}
			require.Equal(t, before, b.get(id))
		}
		_, err = op.DeadLetterByID(b.ctx, leasing.DeadLetterByIDRequest{ID: uuid.New(), Reason: "r", Force: true})
		require.ErrorIs(t, err, leasing.ErrNotFound)
		for _, bad := range []leasing.DeadLetterByIDRequest{{ID: ids[0], Reason: " \t"}, {Reason: "r"}} {
			_, err = op.DeadLetterByID(b.ctx, bad)
			require.ErrorIs(t, err, leasing.ErrInvalidArgument)
		}
	}},
	{"DeadLetterByID/ReasonMustBeText", func(t *testing.T, b *bundle) {
		// Failure.Error is sanitized because a handler's error text is
		// whatever failed; an operator's reason is typed, so bad bytes in
		// it are a mistake to refuse, not to store as U+FFFD.
		op := b.operator()
		id := b.enqueueN(1)[0]
		before := b.get(id)
		for _, reason := range []string{"poison \xff", "poison\x00", "\xc3"} {
			_, err := op.DeadLetterByID(b.ctx, leasing.DeadLetterByIDRequest{ID: id, Reason: reason, Force: true})
			var ae *leasing.ArgumentError
			require.True(t, errors.As(err, &ae), "%q: %v", reason, err)
			require.Equal(t, "reason", ae.Field, reason)
			require.Equal(t, before, b.get(id), "%q: nothing changed", reason)
		}
	}},
}
