package leasingtest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/leasestore/leasestore/leasing"
	"github.com/stretchr/testify/require"
)

// claimCases are the Claim cases: order, batch size, lease and attempt,
// visibility, reclaim of expired leases, tenant scope.
var claimCases = []contractCase{
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
		start := b.get(id).LeaseGeneration
		now := b.env.Clock.Now()
		got := b.claim("owner-1", 1)
		require.Len(t, got, 1)
		l := got[0]
		require.Equal(t, b.q, l.Queue)
		require.Equal(t, "owner-1", l.Owner)
		require.Equal(t, start+1, l.Generation, "a claim adds 1 to the row's generation")
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
	{"Claim/DueAt", func(t *testing.T, b *bundle) {
		// Pending: created_at; deferred: visible_after; failed: the retry
		// time; reclaimed: the expired lease's end.
		created := b.env.Clock.Now()
		b.enqueueN(1)
		deferred := b.enqueue(leasing.NewMessage{Delay: time.Minute})[0]
		b.env.Clock.Advance(2 * time.Minute)
		got := b.claim("a", 2)
		require.Len(t, got, 2)
		require.True(t, created.Equal(got[0].DueAt), "pending: due %s, want %s", got[0].DueAt, created)
		require.Equal(t, deferred, got[1].Message.ID)
		require.True(t, got[1].Message.VisibleAfter.Equal(got[1].DueAt), "deferred: due %s, want %s", got[1].DueAt, got[1].Message.VisibleAfter)
		failedAt := b.env.Clock.Now()
		_, err := b.store.Fail(b.ctx, leasing.Failure{Lease: got[0], RetryAfter: time.Second, Error: "x"})
		require.NoError(t, err)
		b.env.Clock.Advance(lease)
		again := b.claim("b", 2)
		require.Len(t, again, 2)
		require.Equal(t, got[0].Message.ID, again[0].Message.ID)
		require.True(t, failedAt.Add(time.Second).Equal(again[0].DueAt), "failed: due %s, want %s", again[0].DueAt, failedAt.Add(time.Second))
		require.True(t, got[1].ExpiresAt.Equal(again[1].DueAt), "reclaimed: due %s, want %s", again[1].DueAt, got[1].ExpiresAt)
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
