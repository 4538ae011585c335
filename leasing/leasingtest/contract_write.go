package leasingtest

import (
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/leasestore/leasestore/leasing"
	"github.com/stretchr/testify/require"
)

// writes are the five guarded outcome writes, for cases that check all.
var writes = []struct {
	name string
	do   func(b *bundle, l leasing.Lease) (leasing.WriteResult, error)
}{
	{"Release", func(b *bundle, l leasing.Lease) (leasing.WriteResult, error) { return b.store.Release(b.ctx, l) }},
	{"ReleaseAfter", func(b *bundle, l leasing.Lease) (leasing.WriteResult, error) {
		return b.store.ReleaseAfter(b.ctx, leasing.Failure{Lease: l, Error: "busy"}) // due at once, as Release
	}},
	{"Complete", func(b *bundle, l leasing.Lease) (leasing.WriteResult, error) { return b.store.Complete(b.ctx, l) }},
	{"Fail", func(b *bundle, l leasing.Lease) (leasing.WriteResult, error) {
		return b.store.Fail(b.ctx, leasing.Failure{Lease: l, RetryAfter: time.Second, Error: "boom"})
	}},
	{"DeadLetter", func(b *bundle, l leasing.Lease) (leasing.WriteResult, error) {
		return b.store.DeadLetter(b.ctx, leasing.Failure{Lease: l, Error: "poison"})
	}},
}

// writeCases are the cases of the guarded outcome writes: Fail, the fence,
// retried writes, Complete, CompleteAndClaim, Release and ReleaseOrphans.
var writeCases = []contractCase{
	{"Fail/VisibleAgainAfterRetryDelay", func(t *testing.T, b *bundle) {
		id := b.enqueueN(1)[0]
		l := b.claim("a", 1)[0]
		res, err := b.store.Fail(b.ctx, leasing.Failure{Lease: l, RetryAfter: 10 * time.Second, Error: "boom"})
		require.NoError(t, err)
		require.Equal(t, []leasing.Outcome{leasing.OutcomeApplied}, outcomes(res))
		row := b.get(id)
		require.Equal(t, leasing.StatusFailed, row.Status)
		require.Equal(t, "boom", row.LastError)
		require.Nil(t, row.LeaseExpiresAt)
		require.Empty(t, b.claim("a", 1))
		b.env.Clock.Advance(10 * time.Second)
		again := b.claim("a", 1)
		require.Equal(t, []uuid.UUID{id}, idsOf(again))
		require.Equal(t, 2, again[0].Attempt)
		require.Equal(t, "boom", again[0].LastError)
	}},
	{"Fail/ErrorTextSanitised", func(t *testing.T, b *bundle) {
		id := b.enqueueN(1)[0]
		l := b.claim("a", 1)[0]
		bad := "nul\x00byte and \xff invalid " + strings.Repeat("x", leasing.MaxErrorBytes)
		res, err := b.store.Fail(b.ctx, leasing.Failure{Lease: l, Error: bad})
		require.NoError(t, err)
		require.NoError(t, res.Err())
		row := b.get(id)
		require.Equal(t, leasing.SanitizeError(bad), row.LastError)
		require.True(t, strings.HasPrefix(row.LastError, "nul\uFFFDbyte and \uFFFD invalid"))
		require.LessOrEqual(t, len(row.LastError), leasing.MaxErrorBytes)
	}},
	{"Fencing/ReclaimedLeaseCannotWrite", func(t *testing.T, b *bundle) {
		// The same owner name on both claims: only the generation tells them apart.
		id := b.enqueueN(1)[0]
		stale := b.claim("same-owner", 1)[0]
		b.env.Clock.Advance(lease)
		current := b.claim("same-owner", 1)[0]
		require.Equal(t, stale.Generation+1, current.Generation)
		renew, err := b.store.Renew(b.ctx, lease, stale)
		require.NoError(t, err)
		require.Equal(t, []uuid.UUID{id}, renew.Lost)
		for _, w := range writes {
			res, err := w.do(b, stale)
			require.NoError(t, err, w.name)
			require.Equal(t, []leasing.Outcome{leasing.OutcomeLost}, outcomes(res), w.name)
			require.ErrorIs(t, res.Err(), leasing.ErrLeaseLost, w.name)
		}
		row := b.get(id)
		require.Equal(t, b.q.InFlight(), row.Status)
		require.Equal(t, current.Generation, row.LeaseGeneration)
		res, err := b.store.Complete(b.ctx, current)
		require.NoError(t, err)
		require.NoError(t, res.Err())
	}},
	{"Fencing/ExpiredButNotReclaimedMayFinish", func(t *testing.T, b *bundle) {
		id := b.enqueueN(1)[0]
		l := b.claim("a", 1)[0]
		b.env.Clock.Advance(2 * lease)
		res, err := b.store.Complete(b.ctx, l)
		require.NoError(t, err)
		require.Equal(t, []leasing.Outcome{leasing.OutcomeApplied}, outcomes(res))
		require.Equal(t, b.q.Succeeded(), b.get(id).Status)
	}},
	{"Complete/RetryIsAlreadyApplied", func(t *testing.T, b *bundle) {
		id := b.enqueueN(1)[0]
		l := b.claim("a", 1)[0]
		first, err := b.store.Complete(b.ctx, l)
		require.NoError(t, err)
		again, err := b.store.Complete(b.ctx, l)
		require.NoError(t, err)
		require.Equal(t, []leasing.Outcome{leasing.OutcomeApplied}, outcomes(first))
		require.Equal(t, []leasing.Outcome{leasing.OutcomeAlreadyApplied}, outcomes(again))
		require.NoError(t, again.Err())
		row := b.get(id)
		require.Equal(t, b.q.Succeeded(), row.Status)
		require.NotNil(t, row.FinishedAt)
		require.Nil(t, row.LeaseExpiresAt)
	}},
	{"Write/RetriesAreAlreadyApplied", func(t *testing.T, b *bundle) {
		for _, w := range writes {
			b.enqueueN(1)
			l := b.claim("a", 1)[0]
			first, err := w.do(b, l)
			require.NoError(t, err, w.name)
			require.Equal(t, []leasing.Outcome{leasing.OutcomeApplied}, outcomes(first), w.name)
			again, err := w.do(b, l)
			require.NoError(t, err, w.name)
			require.Equal(t, []leasing.Outcome{leasing.OutcomeAlreadyApplied}, outcomes(again), w.name)
			if w.name == "Fail" {
				b.env.Clock.Advance(time.Second) // let the failed row be claimed and settled
				next := b.claim("a", 1)
				_, err := b.store.Complete(b.ctx, next...)
				require.NoError(t, err)
			}
		}
	}},
	{"Write/RetryAfterReclaimIsAlreadyApplied", func(t *testing.T, b *bundle) {
		// A retried Fail or Release whose first try committed, after another
		// worker already claimed the row again: already applied, not lost.
		for _, w := range writes {
			if w.name == "Complete" || w.name == "DeadLetter" {
				continue
			}
			b.enqueueN(1)
			l := b.claim("a", 1)[0]
			_, err := w.do(b, l)
			require.NoError(t, err, w.name)
			b.env.Clock.Advance(time.Second)
			next := b.claim("b", 1)
			require.Len(t, next, 1, w.name)
			again, err := w.do(b, l)
			require.NoError(t, err, w.name)
			require.Equal(t, []leasing.Outcome{leasing.OutcomeAlreadyApplied}, outcomes(again), w.name)
			_, err = b.store.Complete(b.ctx, next...)
			require.NoError(t, err)
		}
	}},
	{"Write/OtherWriteAfterReleaseIsLost", func(t *testing.T, b *bundle) {
		b.enqueueN(1)
		l := b.claim("a", 1)[0]
		_, err := b.store.Release(b.ctx, l)
		require.NoError(t, err)
		b.claim("b", 1)
		for _, w := range writes {
			if strings.HasPrefix(w.name, "Release") {
				continue // the same outcome as this lease's: already applied
			}
			res, err := w.do(b, l)
			require.NoError(t, err, w.name)
			require.Equal(t, []leasing.Outcome{leasing.OutcomeLost}, outcomes(res), "%s after this lease released the row", w.name)
		}
	}},
	{"DeadLetter/RetryAfterRequeueIsAlreadyApplied", func(t *testing.T, b *bundle) {
		id := b.enqueueN(1)[0]
		l := b.claim("a", 1)[0]
		_, err := b.store.DeadLetter(b.ctx, leasing.Failure{Lease: l, Error: "x"})
		require.NoError(t, err)
		_, err = b.store.Requeue(b.ctx, id)
		require.NoError(t, err)
		b.claim("b", 1)
		res, err := b.store.DeadLetter(b.ctx, leasing.Failure{Lease: l, Error: "x"})
		require.NoError(t, err)
		require.Equal(t, []leasing.Outcome{leasing.OutcomeAlreadyApplied}, outcomes(res))
		rel, err := b.store.Release(b.ctx, l)
		require.NoError(t, err)
		require.Equal(t, []leasing.Outcome{leasing.OutcomeLost}, outcomes(rel), "this lease never released the row")
	}},
	{"Complete/TerminalUnderAnotherLease", func(t *testing.T, b *bundle) {
		b.enqueueN(1)
		stale := b.claim("a", 1)[0]
		b.env.Clock.Advance(lease)
		current := b.claim("b", 1)[0]
		_, err := b.store.Complete(b.ctx, current)
		require.NoError(t, err)
		res, err := b.store.Complete(b.ctx, stale)
		require.NoError(t, err)
		require.Equal(t, []leasing.Outcome{leasing.OutcomeTerminal}, outcomes(res))
		require.ErrorIs(t, res.Err(), leasing.ErrAlreadyTerminal)
	}},
	{"Complete/UnknownIDIsNotFound", func(t *testing.T, b *bundle) {
		b.enqueueN(1)
		l := b.claim("a", 1)[0]
		ghost := l
		ghost.Message.ID = uuid.New()
		res, err := b.store.Complete(b.ctx, l, ghost)
		require.NoError(t, err)
		require.Equal(t, []leasing.Outcome{leasing.OutcomeApplied, leasing.OutcomeNotFound}, outcomes(res))
		require.ErrorIs(t, res.Err(), leasing.ErrNotFound)
	}},
	{"Complete/BatchInInputOrder", func(t *testing.T, b *bundle) {
		b.enqueueN(4)
		ls := b.claim("a", 4)
		order := []leasing.Lease{ls[3], ls[0], ls[2], ls[1]}
		res, err := b.store.Complete(b.ctx, order...)
		require.NoError(t, err)
		require.Equal(t, idsOf(order), []uuid.UUID{res.Outcomes[0].MessageID, res.Outcomes[1].MessageID, res.Outcomes[2].MessageID, res.Outcomes[3].MessageID})
		require.Equal(t, 4, res.Count(leasing.OutcomeApplied))
	}},
	{"CompleteAndClaim/CompletesThenClaimsNext", func(t *testing.T, b *bundle) {
		ids := b.enqueueN(5)
		req := leasing.ClaimRequest{Owner: "a", BatchSize: 2, LeaseFor: lease}
		none, first, err := b.completeAndClaim(nil, req)
		require.NoError(t, err)
		require.Empty(t, none.Outcomes)
		require.Equal(t, ids[:2], idsOf(first))
		res, next, err := b.completeAndClaim(first, req)
		require.NoError(t, err)
		require.Equal(t, []leasing.Outcome{leasing.OutcomeApplied, leasing.OutcomeApplied}, outcomes(res))
		require.Equal(t, ids[:2], []uuid.UUID{res.Outcomes[0].MessageID, res.Outcomes[1].MessageID})
		require.Equal(t, ids[2:4], idsOf(next))
		for _, id := range ids[:2] {
			require.Equal(t, b.q.Succeeded(), b.get(id).Status)
		}
		for _, l := range next {
			row := b.get(l.Message.ID)
			require.Equal(t, b.q.InFlight(), row.Status)
			require.Equal(t, "a", row.LeaseOwner)
			require.Equal(t, l.Generation, row.LeaseGeneration)
		}
		// A retry of the same completes reports already_applied and still claims.
		again, last, err := b.completeAndClaim(first, req)
		require.NoError(t, err)
		require.Equal(t, []leasing.Outcome{leasing.OutcomeAlreadyApplied, leasing.OutcomeAlreadyApplied}, outcomes(again))
		require.Equal(t, ids[4:], idsOf(last))
		// Nothing left: the completes apply and the claim is empty, not nil.
		_, empty, err := b.completeAndClaim(append(next, last...), req)
		require.NoError(t, err)
		require.NotNil(t, empty)
		require.Empty(t, empty)
		st, err := b.store.Stats(b.ctx)
		require.NoError(t, err)
		require.Equal(t, int64(5), st.Depth[b.q.Succeeded()])
	}},
	{"CompleteAndClaim/LostLeaseDoesNotStopTheClaim", func(t *testing.T, b *bundle) {
		ids := b.enqueueN(3)
		stale := b.claim("a", 1)
		b.env.Clock.Advance(2 * lease)
		taken := b.claim("b", 1) // reclaims the expired lease
		require.Equal(t, idsOf(stale), idsOf(taken))
		res, next, err := b.completeAndClaim(stale, leasing.ClaimRequest{Owner: "a", BatchSize: 5, LeaseFor: lease})
		require.NoError(t, err)
		require.Equal(t, []leasing.Outcome{leasing.OutcomeLost}, outcomes(res))
		require.ErrorIs(t, res.Err(), leasing.ErrLeaseLost)
		require.Equal(t, ids[1:], idsOf(next))
		row := b.get(ids[0])
		require.Equal(t, b.q.InFlight(), row.Status)
		require.Equal(t, "b", row.LeaseOwner)
	}},
	{"Release/ClaimableAtOnceWithoutBurningAttempt", func(t *testing.T, b *bundle) {
		id := b.enqueueN(1)[0]
		l := b.claim("a", 1)[0]
		res, err := b.store.Release(b.ctx, l)
		require.NoError(t, err)
		require.NoError(t, res.Err())
		row := b.get(id)
		require.Equal(t, leasing.StatusPending, row.Status)
		require.Equal(t, 0, row.AttemptCount)
		require.Empty(t, row.LeaseOwner)
		require.Nil(t, row.LeaseExpiresAt)
		again := b.claim("b", 1)
		require.Equal(t, []uuid.UUID{id}, idsOf(again))
		require.Equal(t, 1, again[0].Attempt)
		require.Equal(t, l.Generation+1, again[0].Generation)
	}},
	{"ReleaseAfter/VisibleAfterDelayWithoutBurningAttempt", func(t *testing.T, b *bundle) {
		ids := b.enqueueN(2)
		ls := b.claim("a", 2)
		res, err := b.store.ReleaseAfter(b.ctx,
			leasing.Failure{Lease: ls[0], RetryAfter: 10 * time.Second, Error: "broker down"},
			leasing.Failure{Lease: ls[1], RetryAfter: 0, Error: "nul\x00"})
		require.NoError(t, err)
		require.Equal(t, []leasing.Outcome{leasing.OutcomeApplied, leasing.OutcomeApplied}, outcomes(res))
		row := b.get(ids[0])
		require.Equal(t, leasing.StatusPending, row.Status)
		require.Zero(t, row.AttemptCount, "the attempt is returned")
		require.Equal(t, "broker down", row.LastError)
		require.Empty(t, row.LeaseOwner)
		require.Nil(t, row.LeaseExpiresAt)
		require.Equal(t, b.env.Clock.Now().Add(10*time.Second), row.VisibleAfter)
		require.Equal(t, leasing.SanitizeError("nul\x00"), b.get(ids[1]).LastError)
		last := row.Attempts[len(row.Attempts)-1]
		require.Equal(t, leasing.AttemptReleased, last.End)
		require.Equal(t, "broker down", last.Error)

		require.Equal(t, []uuid.UUID{ids[1]}, idsOf(b.claim("b", 2)), "invisible until its delay ends")
		b.env.Clock.Advance(10 * time.Second)
		again := b.claim("b", 2)
		require.Equal(t, []uuid.UUID{ids[0]}, idsOf(again))
		require.Equal(t, 1, again[0].Attempt, "no attempt was spent")
		require.Equal(t, "broker down", again[0].LastError)
		require.Equal(t, ls[0].Generation+1, again[0].Generation)

		res, err = b.store.ReleaseAfter(b.ctx, leasing.Failure{Lease: ls[0], RetryAfter: time.Second, Error: "late"})
		require.NoError(t, err)
		require.Equal(t, []leasing.Outcome{leasing.OutcomeAlreadyApplied}, outcomes(res), "a retry of the first lease's write")
		res, err = b.store.Release(b.ctx, again[0])
		require.NoError(t, err)
		require.NoError(t, res.Err())
		require.Equal(t, "broker down", b.get(ids[0]).LastError, "Release keeps the last error")
	}},
	{"ReleaseOrphans/ReleasesUnheldLeasesOfOwner", func(t *testing.T, b *bundle) {
		ids := b.enqueueN(4)
		mine := b.claim("me", 3)
		theirs := b.claim("them", 1)
		released, err := b.store.ReleaseOrphans(b.ctx, "me", []uuid.UUID{mine[0].Message.ID, mine[2].Message.ID})
		require.NoError(t, err)
		require.Equal(t, []uuid.UUID{ids[1]}, released)
		row := b.get(ids[1])
		require.Equal(t, leasing.StatusPending, row.Status)
		require.Equal(t, 0, row.AttemptCount, "an orphaned claim does not burn an attempt")
		require.Empty(t, row.LeaseOwner)
		require.Equal(t, b.q.InFlight(), b.get(ids[0]).Status)
		require.Equal(t, "them", b.get(theirs[0].Message.ID).LeaseOwner)
		res, err := b.store.Complete(b.ctx, mine[1])
		require.NoError(t, err)
		require.Equal(t, []leasing.Outcome{leasing.OutcomeLost}, outcomes(res), "the orphaned lease is fenced")
		none, err := b.store.ReleaseOrphans(b.ctx, "me", nil)
		require.NoError(t, err)
		require.ElementsMatch(t, idsOf([]leasing.Lease{mine[0], mine[2]}), none, "nil held releases every lease of the owner")
		_, err = b.store.ReleaseOrphans(b.ctx, "", nil)
		require.ErrorIs(t, err, leasing.ErrInvalidArgument)
	}},
	{"ReleaseOrphans/LeavesExpiredLeases", func(t *testing.T, b *bundle) {
		// An expired lease of the owner may be one it held and lost after
		// its handler ran: releasing it would return an attempt that ran.
		ids := b.enqueueN(2)
		expired := b.claim("me", 1)[0]
		b.env.Clock.Advance(lease / 2)
		live := b.claim("me", 1)[0]
		b.env.Clock.Advance(lease / 2) // expired's lease ends now
		released, err := b.store.ReleaseOrphans(b.ctx, "me", nil)
		require.NoError(t, err)
		require.Equal(t, []uuid.UUID{live.Message.ID}, released, "only the lease that has not expired")
		require.Equal(t, 0, b.get(ids[1]).AttemptCount)
		row := b.get(ids[0])
		require.Equal(t, b.q.InFlight(), row.Status)
		require.Equal(t, "me", row.LeaseOwner)
		require.Equal(t, 1, row.AttemptCount, "the expired lease keeps its attempt")
		require.Empty(t, row.Attempts)
		again := b.claim("them", 1)
		require.Equal(t, []uuid.UUID{ids[0]}, idsOf(again), "reclaimed as an expired lease")
		require.Equal(t, 2, again[0].Attempt)
		require.Equal(t, expired.Generation+1, again[0].Generation)
	}},
}
