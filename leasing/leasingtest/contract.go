package leasingtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/leasestore/leasestore/leasing"
	"github.com/stretchr/testify/require"
)

// Env is one isolated data set for one contract case.
type Env struct {
	// Clock drives every store Open returns: the stores decide visibility
	// and expiry by it alone.
	Clock *Clock
	// Open returns a store for queue q over the Env's data. Each call may
	// use its own connections; all stores of one Env see the same rows.
	Open func(t testing.TB, q leasing.Queue) leasing.Store
}

// Start is the clock reading contract cases begin at.
var Start = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

const lease = 30 * time.Second

// Run runs the whole contract, for both queues, against a fresh Env from
// newEnv for every case.
func Run(t *testing.T, newEnv func(t *testing.T) Env) {
	for _, q := range []leasing.Queue{leasing.Inbox, leasing.Outbox} {
		t.Run(string(q), func(t *testing.T) {
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					env := newEnv(t)
					c.run(t, &bundle{t: t, env: env, q: q, store: env.Open(t, q), ctx: context.Background()})
				})
			}
		})
	}
}

// bundle is what one case works with.
type bundle struct {
	t     *testing.T
	env   Env
	q     leasing.Queue
	store leasing.Store
	ctx   context.Context
}

func (b *bundle) enqueue(msgs ...leasing.NewMessage) []uuid.UUID {
	b.t.Helper()
	res, err := b.store.Enqueue(b.ctx, msgs...)
	require.NoError(b.t, err)
	require.Empty(b.t, res.Duplicates)
	return res.IDs
}

// enqueueN enqueues n messages one clock tick apart and returns their ids
// in FIFO order.
func (b *bundle) enqueueN(n int) []uuid.UUID {
	b.t.Helper()
	ids := make([]uuid.UUID, 0, n)
	for range n {
		ids = append(ids, b.enqueue(leasing.NewMessage{Payload: []byte("p")})...)
		b.env.Clock.Advance(time.Millisecond)
	}
	return ids
}

func (b *bundle) claim(owner string, n int) []leasing.Lease {
	b.t.Helper()
	leases, err := b.store.Claim(b.ctx, leasing.ClaimRequest{Owner: owner, BatchSize: n, LeaseFor: lease})
	require.NoError(b.t, err)
	require.NotNil(b.t, leases)
	return leases
}

func (b *bundle) get(id uuid.UUID) leasing.Row {
	b.t.Helper()
	row, err := b.store.Get(b.ctx, id)
	require.NoError(b.t, err)
	return row
}

func idsOf(leases []leasing.Lease) []uuid.UUID {
	ids := make([]uuid.UUID, len(leases))
	for i, l := range leases {
		ids[i] = l.Message.ID
	}
	return ids
}

func outcomes(res leasing.WriteResult) []leasing.Outcome {
	out := make([]leasing.Outcome, len(res.Outcomes))
	for i, o := range res.Outcomes {
		out[i] = o.Outcome
	}
	return out
}

// writes are the four guarded outcome writes, for cases that check all.
var writes = []struct {
	name string
	do   func(b *bundle, l leasing.Lease) (leasing.WriteResult, error)
}{
	{"Release", func(b *bundle, l leasing.Lease) (leasing.WriteResult, error) { return b.store.Release(b.ctx, l) }},
	{"Complete", func(b *bundle, l leasing.Lease) (leasing.WriteResult, error) { return b.store.Complete(b.ctx, l) }},
	{"Fail", func(b *bundle, l leasing.Lease) (leasing.WriteResult, error) {
		return b.store.Fail(b.ctx, leasing.Failure{Lease: l, RetryAfter: time.Second, Error: "boom"})
	}},
	{"DeadLetter", func(b *bundle, l leasing.Lease) (leasing.WriteResult, error) {
		return b.store.DeadLetter(b.ctx, leasing.Failure{Lease: l, Error: "poison"})
	}},
}

var cases = []struct {
	name string
	run  func(t *testing.T, b *bundle)
}{
	{"Claim/FIFOByCreatedAt", func(t *testing.T, b *bundle) {
		ids := b.enqueueN(5)
		require.Equal(t, ids[:3], idsOf(b.claim("a", 3)))
		require.Equal(t, ids[3:], idsOf(b.claim("a", 10)))
	}},
	{"Claim/SameInstantOrderedByID", func(t *testing.T, b *bundle) {
		ids := b.enqueue(
			leasing.NewMessage{ID: uuid.MustParse("00000000-0000-0000-0000-000000000003")},
			leasing.NewMessage{ID: uuid.MustParse("00000000-0000-0000-0000-000000000001")},
			leasing.NewMessage{ID: uuid.MustParse("00000000-0000-0000-0000-000000000002")},
		)
		got := idsOf(b.claim("a", 3))
		require.Equal(t, []uuid.UUID{ids[1], ids[2], ids[0]}, got)
	}},
	{"Claim/RespectsBatchSize", func(t *testing.T, b *bundle) {
		b.enqueueN(25)
		require.Len(t, b.claim("a", 10), 10)
		require.Len(t, b.claim("b", 10), 10)
		require.Len(t, b.claim("a", 10), 5)
		require.Empty(t, b.claim("b", 10))
	}},
	{"Claim/SetsLeaseAndCountsAttempt", func(t *testing.T, b *bundle) {
		id := b.enqueueN(1)[0]
		now := b.env.Clock.Now()
		got := b.claim("owner-1", 1)
		require.Len(t, got, 1)
		l := got[0]
		require.Equal(t, b.q, l.Queue)
		require.Equal(t, "owner-1", l.Owner)
		require.Equal(t, int64(1), l.Generation)
		require.Equal(t, 1, l.Attempt)
		require.True(t, now.Add(lease).Equal(l.ExpiresAt), "expires %s, want %s", l.ExpiresAt, now.Add(lease))
		row := b.get(id)
		require.Equal(t, b.q.InFlight(), row.Status)
		require.Equal(t, "owner-1", row.LeaseOwner)
		require.Equal(t, 1, row.AttemptCount)
		require.NotNil(t, row.LeaseExpiresAt)
		require.True(t, l.ExpiresAt.Equal(*row.LeaseExpiresAt))
		require.True(t, now.Equal(*row.LastAttemptedAt))
	}},
	{"Claim/DeferredVisibility", func(t *testing.T, b *bundle) {
		id := b.enqueue(leasing.NewMessage{Delay: time.Minute})[0]
		require.Empty(t, b.claim("a", 10))
		b.env.Clock.Advance(time.Minute - time.Microsecond)
		require.Empty(t, b.claim("a", 10))
		b.env.Clock.Advance(time.Microsecond)
		require.Equal(t, []uuid.UUID{id}, idsOf(b.claim("a", 10)))
	}},
	{"Claim/DeferredRowDoesNotBlockLaterRows", func(t *testing.T, b *bundle) {
		b.enqueue(leasing.NewMessage{Delay: time.Hour})
		later := b.enqueueN(2)
		require.Equal(t, later, idsOf(b.claim("a", 10)))
	}},
	{"Claim/ReclaimsExpiredLease", func(t *testing.T, b *bundle) {
		id := b.enqueueN(1)[0]
		first := b.claim("a", 1)[0]
		b.env.Clock.Advance(lease - time.Microsecond)
		require.Empty(t, b.claim("b", 1), "a live lease must not be reclaimed")
		b.env.Clock.Advance(time.Microsecond)
		second := b.claim("b", 1)
		require.Equal(t, []uuid.UUID{id}, idsOf(second))
		require.Equal(t, first.Generation+1, second[0].Generation)
		require.Equal(t, 2, second[0].Attempt)
		require.Equal(t, "b", b.get(id).LeaseOwner)
	}},
	{"Claim/ExpiredLeaseKeepsFIFOPlace", func(t *testing.T, b *bundle) {
		ids := b.enqueueN(3)
		b.claim("a", 1) // ids[0]
		b.env.Clock.Advance(lease)
		require.Equal(t, ids, idsOf(b.claim("b", 3)))
	}},
	{"Claim/TenantScoping", func(t *testing.T, b *bundle) {
		a := b.enqueue(leasing.NewMessage{TenantID: "tenant-a"}, leasing.NewMessage{TenantID: "tenant-a"})
		bIDs := b.enqueue(leasing.NewMessage{TenantID: "tenant-b"})
		got, err := b.store.Claim(b.ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 10, LeaseFor: lease, TenantID: "tenant-b"})
		require.NoError(t, err)
		require.Equal(t, bIDs, idsOf(got))
		got, err = b.store.Claim(b.ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 10, LeaseFor: lease, TenantID: "tenant-b"})
		require.NoError(t, err)
		require.Empty(t, got)
		require.ElementsMatch(t, a, idsOf(b.claim("w", 10)))
	}},
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
	{"Renew/ExtendsLease", func(t *testing.T, b *bundle) {
		id := b.enqueueN(1)[0]
		l := b.claim("a", 1)[0]
		b.env.Clock.Advance(20 * time.Second)
		res, err := b.store.Renew(b.ctx, lease, l)
		require.NoError(t, err)
		require.NoError(t, res.Err())
		require.Len(t, res.Renewed, 1)
		want := b.env.Clock.Now().Add(lease)
		require.True(t, want.Equal(res.Renewed[0].ExpiresAt))
		require.True(t, want.Equal(*b.get(id).LeaseExpiresAt))
		b.env.Clock.Advance(lease - time.Microsecond)
		require.Empty(t, b.claim("b", 1), "a renewed lease must not be reclaimed")
	}},
	{"Renew/ExpiredLeaseIsLost", func(t *testing.T, b *bundle) {
		b.enqueueN(1)
		l := b.claim("a", 1)[0]
		b.env.Clock.Advance(lease)
		res, err := b.store.Renew(b.ctx, lease, l)
		require.NoError(t, err)
		require.Equal(t, []uuid.UUID{l.Message.ID}, res.Lost)
		require.ErrorIs(t, res.Err(), leasing.ErrLeaseLost)
	}},
	{"Renew/BatchReportsLostOnes", func(t *testing.T, b *bundle) {
		b.enqueueN(3)
		ls := b.claim("a", 3)
		_, err := b.store.Complete(b.ctx, ls[1])
		require.NoError(t, err)
		res, err := b.store.Renew(b.ctx, lease, ls...)
		require.NoError(t, err)
		require.Equal(t, []uuid.UUID{ls[0].Message.ID, ls[2].Message.ID}, idsOf(res.Renewed))
		require.Equal(t, []uuid.UUID{ls[1].Message.ID}, res.Lost)
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
			if w.name == "Release" {
				continue
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
		none, first, err := b.store.CompleteAndClaim(b.ctx, nil, req)
		require.NoError(t, err)
		require.Empty(t, none.Outcomes)
		require.Equal(t, ids[:2], idsOf(first))
		res, next, err := b.store.CompleteAndClaim(b.ctx, first, req)
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
		again, last, err := b.store.CompleteAndClaim(b.ctx, first, req)
		require.NoError(t, err)
		require.Equal(t, []leasing.Outcome{leasing.OutcomeAlreadyApplied, leasing.OutcomeAlreadyApplied}, outcomes(again))
		require.Equal(t, ids[4:], idsOf(last))
		// Nothing left: the completes apply and the claim is empty, not nil.
		_, empty, err := b.store.CompleteAndClaim(b.ctx, append(next, last...), req)
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
		res, next, err := b.store.CompleteAndClaim(b.ctx, stale, leasing.ClaimRequest{Owner: "a", BatchSize: 5, LeaseFor: lease})
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
	{"Enqueue/InboxIdempotencyKey", func(t *testing.T, b *bundle) {
		if b.q != leasing.Inbox {
			t.Skip("idempotency keys are an inbox feature")
		}
		first, err := b.store.Enqueue(b.ctx, leasing.NewMessage{IdempotencyKey: "k1"}, leasing.NewMessage{IdempotencyKey: "k1", TenantID: "t"})
		require.NoError(t, err)
		require.Empty(t, first.Duplicates)
		again, err := b.store.Enqueue(b.ctx,
			leasing.NewMessage{IdempotencyKey: "k1"},
			leasing.NewMessage{IdempotencyKey: "k1", TenantID: "t"},
			leasing.NewMessage{IdempotencyKey: "k2"},
			leasing.NewMessage{ID: first.IDs[0]})
		require.NoError(t, err)
		require.Equal(t, []uuid.UUID{again.IDs[0], again.IDs[1], first.IDs[0]}, again.Duplicates)
		st, err := b.store.Stats(b.ctx)
		require.NoError(t, err)
		require.Equal(t, int64(3), st.Depth[leasing.StatusPending])
	}},
	{"Enqueue/OutboxDuplicateIDFails", func(t *testing.T, b *bundle) {
		if b.q != leasing.Outbox {
			t.Skip("the inbox reports duplicates instead")
		}
		ids := b.enqueue(leasing.NewMessage{Topic: "orders"})
		_, err := b.store.Enqueue(b.ctx, leasing.NewMessage{Topic: "orders"}, leasing.NewMessage{ID: ids[0]})
		require.ErrorIs(t, err, leasing.ErrDuplicate)
		st, err := b.store.Stats(b.ctx)
		require.NoError(t, err)
		require.Equal(t, int64(1), st.Depth[leasing.StatusPending], "a failed batch inserts nothing")
	}},
	{"Enqueue/KeepsMessageContent", func(t *testing.T, b *bundle) {
		msg := leasing.NewMessage{Type: "order.created", Payload: []byte{0, 1, 2, 255}, Headers: []byte(`{"trace":"abc"}`), TenantID: "t1"}
		if b.q == leasing.Outbox {
			msg.Topic = "orders"
		} else {
			msg.IdempotencyKey = "key-1"
		}
		id := b.enqueue(msg)[0]
		l := b.claim("a", 1)[0]
		require.Equal(t, id, l.Message.ID)
		require.Equal(t, msg.Type, l.Message.Type)
		require.Equal(t, msg.Payload, l.Message.Payload)
		require.JSONEq(t, string(msg.Headers), string(l.Message.Headers))
		require.Equal(t, msg.TenantID, l.Message.TenantID)
		require.Equal(t, msg.Topic, l.Message.Topic)
		require.Equal(t, msg.IdempotencyKey, l.Message.IdempotencyKey)
		require.True(t, Start.Equal(l.Message.CreatedAt))
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
			leasing.StatusFailed: 0, leasing.StatusDeadLettered: 1,
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
	{"BadInput/RejectedAndNothingChanged", badInput},
	{"Concurrency/DisjointClaims", disjointClaims},
}

// badInput checks that every malformed call fails with an *ArgumentError
// before touching the store.
func badInput(t *testing.T, b *bundle) {
	ids := b.enqueueN(3)
	held := b.claim("a", 1)[0]
	before := snapshot(t, b, ids)
	other := leasing.Outbox
	if b.q == leasing.Outbox {
		other = leasing.Inbox
	}
	fromOther := held
	fromOther.Queue = other
	otherOwner := held
	otherOwner.Owner = "b"
	unclaimed := held
	unclaimed.Generation = 0
	claim := func(r leasing.ClaimRequest) error { _, err := b.store.Claim(b.ctx, r); return err }
	good := leasing.ClaimRequest{Owner: "a", BatchSize: 1, LeaseFor: lease}
	with := func(f func(*leasing.ClaimRequest)) leasing.ClaimRequest { r := good; f(&r); return r }
	wrongField := leasing.NewMessage{Topic: "t"}
	if b.q == leasing.Outbox {
		wrongField = leasing.NewMessage{IdempotencyKey: "k"}
	}
	calls := map[string]func() error{
		"claim zero batch":     func() error { return claim(with(func(r *leasing.ClaimRequest) { r.BatchSize = 0 })) },
		"claim negative batch": func() error { return claim(with(func(r *leasing.ClaimRequest) { r.BatchSize = -1 })) },
		"claim huge batch":     func() error { return claim(with(func(r *leasing.ClaimRequest) { r.BatchSize = 1 << 30 })) },
		"claim empty owner":    func() error { return claim(with(func(r *leasing.ClaimRequest) { r.Owner = "" })) },
		"claim long owner": func() error {
			return claim(with(func(r *leasing.ClaimRequest) { r.Owner = strings.Repeat("o", 1000) }))
		},
		"claim non-UTF-8 owner": func() error { return claim(with(func(r *leasing.ClaimRequest) { r.Owner = "\xff\xfe" })) },
		"claim zero lease":      func() error { return claim(with(func(r *leasing.ClaimRequest) { r.LeaseFor = 0 })) },
		"claim negative lease":  func() error { return claim(with(func(r *leasing.ClaimRequest) { r.LeaseFor = -time.Second })) },
		"claim enormous lease":  func() error { return claim(with(func(r *leasing.ClaimRequest) { r.LeaseFor = 1 << 62 })) },
		"claim NUL in tenant":   func() error { return claim(with(func(r *leasing.ClaimRequest) { r.TenantID = "t\x00" })) },
		"renew no leases":       func() error { _, err := b.store.Renew(b.ctx, lease); return err },
		"renew zero duration":   func() error { _, err := b.store.Renew(b.ctx, 0, held); return err },
		"renew other queue":     func() error { _, err := b.store.Renew(b.ctx, lease, fromOther); return err },
		"renew mixed owners":    func() error { _, err := b.store.Renew(b.ctx, lease, held, otherOwner); return err },
		"renew duplicate lease": func() error { _, err := b.store.Renew(b.ctx, lease, held, held); return err },
		"release nil":           func() error { _, err := b.store.Release(b.ctx, nil...); return err },
		"release other queue":   func() error { _, err := b.store.Release(b.ctx, fromOther); return err },
		"complete unclaimed":    func() error { _, err := b.store.Complete(b.ctx, unclaimed); return err },
		"complete other queue":  func() error { _, err := b.store.Complete(b.ctx, fromOther); return err },
		"complete and claim bad request": func() error {
			_, _, err := b.store.CompleteAndClaim(b.ctx, []leasing.Lease{held}, with(func(r *leasing.ClaimRequest) { r.BatchSize = 0 }))
			return err
		},
		"complete and claim other queue": func() error {
			_, _, err := b.store.CompleteAndClaim(b.ctx, []leasing.Lease{fromOther}, good)
			return err
		},
		"complete and claim unclaimed": func() error {
			_, _, err := b.store.CompleteAndClaim(b.ctx, []leasing.Lease{unclaimed}, good)
			return err
		},
		"claim after nothing, bad owner": func() error {
			_, _, err := b.store.CompleteAndClaim(b.ctx, nil, with(func(r *leasing.ClaimRequest) { r.Owner = "" }))
			return err
		},
		"fail negative delay": func() error { _, err := b.store.Fail(b.ctx, leasing.Failure{Lease: held, RetryAfter: -1}); return err },
		"fail none":           func() error { _, err := b.store.Fail(b.ctx); return err },
		"dead-letter other":   func() error { _, err := b.store.DeadLetter(b.ctx, leasing.Failure{Lease: fromOther}); return err },
		"enqueue none":        func() error { _, err := b.store.Enqueue(b.ctx); return err },
		"enqueue payload too big": func() error {
			_, err := b.store.Enqueue(b.ctx, leasing.NewMessage{}, leasing.NewMessage{Payload: make([]byte, leasing.MaxPayloadBytes+1)})
			return err
		},
		"enqueue negative delay": func() error { _, err := b.store.Enqueue(b.ctx, leasing.NewMessage{Delay: -time.Second}); return err },
		"enqueue bad headers":    func() error { _, err := b.store.Enqueue(b.ctx, leasing.NewMessage{Headers: []byte("[1]")}); return err },
		"enqueue NUL in type":    func() error { _, err := b.store.Enqueue(b.ctx, leasing.NewMessage{Type: "a\x00b"}); return err },
		"enqueue other queue field": func() error {
			_, err := b.store.Enqueue(b.ctx, wrongField)
			return err
		},
		"requeue no ids":   func() error { _, err := b.store.Requeue(b.ctx); return err },
		"requeue dup ids":  func() error { _, err := b.store.Requeue(b.ctx, ids[0], ids[0]); return err },
		"purge zero age":   func() error { _, err := b.store.Purge(b.ctx, leasing.PurgeRequest{BatchSize: 1}); return err },
		"purge zero batch": func() error { _, err := b.store.Purge(b.ctx, leasing.PurgeRequest{OlderThan: time.Hour}); return err },
	}
	for name, call := range calls {
		err := call()
		require.ErrorIs(t, err, leasing.ErrInvalidArgument, name)
		var argErr *leasing.ArgumentError
		require.True(t, errors.As(err, &argErr), name)
	}
	// The payload limit itself is accepted.
	_, err := b.store.Enqueue(b.ctx, leasing.NewMessage{Payload: make([]byte, leasing.MaxPayloadBytes)})
	require.NoError(t, err)
	require.Equal(t, before, snapshot(t, b, ids))
}

// snapshot is the state of the rows ids plus the queue depth, as text.
func snapshot(t *testing.T, b *bundle, ids []uuid.UUID) string {
	t.Helper()
	var sb strings.Builder
	for _, id := range ids {
		row, err := b.store.Get(b.ctx, id)
		require.NoError(t, err)
		fmt.Fprintf(&sb, "%+v\n", row)
	}
	st, err := b.store.Stats(b.ctx)
	require.NoError(t, err)
	fmt.Fprintf(&sb, "%v %d\n", st.Depth[b.q.InFlight()], st.ExpiredLeases)
	return sb.String()
}

// disjointClaims has 8 stores (on their own connections where the store
// has any) claim batches of 10 from 1,000 rows at once: every row must be
// claimed exactly once.
func disjointClaims(t *testing.T, b *bundle) {
	const rows, workers, batch = 1000, 8, 10
	msgs := make([]leasing.NewMessage, rows)
	res, err := b.store.Enqueue(b.ctx, msgs...)
	require.NoError(t, err)
	stores := make([]leasing.Store, workers)
	for i := range stores {
		stores[i] = b.env.Open(t, b.q)
	}
	var (
		mu      sync.Mutex
		claimed = map[uuid.UUID]int{}
		start   = make(chan struct{})
		wg      sync.WaitGroup
		errs    = make(chan error, workers)
	)
	for i, s := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			owner := fmt.Sprintf("worker-%d", i)
			for {
				ls, err := s.Claim(b.ctx, leasing.ClaimRequest{Owner: owner, BatchSize: batch, LeaseFor: time.Hour})
				if err != nil {
					errs <- err
					return
				}
				if len(ls) == 0 {
					return
				}
				mu.Lock()
				for _, l := range ls {
					claimed[l.Message.ID]++
				}
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Len(t, claimed, rows)
	for _, id := range res.IDs {
		require.Equal(t, 1, claimed[id], "message %s", id)
	}
}
