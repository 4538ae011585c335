package leasing_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
)

// TestRetentionPolicy: Resolve fills the defaults and refuses a window
// shorter than the min dedup window, dead letters kept shorter than
// finished rows, and bad sizes.
func TestRetentionPolicy(t *testing.T) {
	t.Parallel()
	p, err := leasing.RetentionPolicy{Finished: time.Hour}.Resolve()
	require.NoError(t, err)
	require.Equal(t, leasing.DefaultRetentionBatch, p.BatchSize)
	require.Equal(t, leasing.DefaultRetentionInterval, p.Interval)
	for _, bad := range []leasing.RetentionPolicy{
		{},
		{Finished: time.Hour, MinDedupWindow: 2 * time.Hour},
		{Finished: time.Hour, DeadLettered: time.Minute},
		{Finished: time.Hour, DeadLettered: -time.Hour},
		{Finished: time.Hour, BatchSize: leasing.MaxBatchSize + 1},
		{Finished: time.Hour, Interval: -1},
	} {
		_, err := bad.Resolve()
		require.ErrorIs(t, err, leasing.ErrInvalidArgument, "%+v", bad)
	}
}

// TestPurgeRetention: finished rows go after Finished and dead letters
// after DeadLettered, a batch at a time; Retained reports the oldest rows
// kept (the inbox's effective dedup window), and an idempotency key is
// accepted again once its row is purged. Runs wait for the queue's
// retention turn: while another transaction holds it, a run times out
// having deleted nothing.
func TestPurgeRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	clock := leasingtest.NewClock(leasingtest.Start)
	pg, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{Now: clock.Now, LockTimeout: 100 * time.Millisecond})
	require.NoError(t, err)

	finish := func(n int, dead bool) []uuid.UUID {
		t.Helper()
		msgs := make([]leasing.NewMessage, n)
		for i := range msgs {
			msgs[i] = leasing.NewMessage{Type: "t", Payload: []byte("x"), IdempotencyKey: fmt.Sprintf("%t-%d-%s", dead, i, clock.Now())}
		}
		_, err := pg.Enqueue(ctx, msgs...)
		require.NoError(t, err)
		leases, err := pg.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: n, LeaseFor: time.Minute})
		require.NoError(t, err)
		require.Len(t, leases, n)
		ids := make([]uuid.UUID, n)
		for i, l := range leases {
			ids[i] = l.Message.ID
		}
		if dead {
			fs := make([]leasing.Failure, n)
			for i, l := range leases {
				fs[i] = leasing.Failure{Lease: l, Error: "boom"}
			}
			_, err = pg.DeadLetter(ctx, fs...)
		} else {
			_, err = pg.Complete(ctx, leases...)
		}
		require.NoError(t, err)
		return ids
	}
	firstKey := fmt.Sprintf("false-0-%s", clock.Now())
	oldDone := finish(5, false)
	oldDead := finish(2, true)
	clock.Advance(90 * time.Minute)
	newDone := finish(1, false)

	kept, err := pg.Retained(ctx)
	require.NoError(t, err)
	require.Equal(t, 90*time.Minute, kept.FinishedWindow())
	require.NotNil(t, kept.OldestDeadLettered)

	policy := leasing.RetentionPolicy{Finished: time.Hour, DeadLettered: 2 * time.Hour, BatchSize: 2}
	turn, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = turn.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended('leasestore:retention:inbox', 0))")
	require.NoError(t, err)
	res, err := pg.PurgeRetention(ctx, policy)
	require.ErrorIs(t, err, leasing.ErrLockTimeout, "another runner holds the turn")
	require.Zero(t, res.Finished)
	require.NoError(t, turn.Rollback(ctx))

	total := 0
	for {
		res, err := pg.PurgeRetention(ctx, policy)
		require.NoError(t, err)
		require.LessOrEqual(t, res.Finished, 2)
		total += res.Finished + res.DeadLettered
		if res.Finished < 2 && res.DeadLettered < 2 {
			break
		}
	}
	require.Equal(t, len(oldDone), total, "the old finished rows only")
	for _, id := range oldDone {
		_, err := pg.Get(ctx, id)
		require.ErrorIs(t, err, leasing.ErrNotFound)
	}
	for _, id := range append(oldDead, newDone...) {
		_, err := pg.Get(ctx, id)
		require.NoError(t, err)
	}
	kept, err = pg.Retained(ctx)
	require.NoError(t, err)
	require.Zero(t, kept.FinishedWindow())
	again, err := pg.Enqueue(ctx, leasing.NewMessage{Type: "t", Payload: []byte("x"), IdempotencyKey: firstKey})
	require.NoError(t, err)
	require.Empty(t, again.Duplicates, "past the retention the key is new again: the dedup window ended")

	clock.Advance(61 * time.Minute) // the dead letters are 151 minutes old
	res, err = pg.PurgeRetention(ctx, policy)
	require.NoError(t, err)
	require.Equal(t, leasing.RetentionResult{Finished: 1, DeadLettered: 2}, res)
	kept, err = pg.Retained(ctx)
	require.NoError(t, err)
	require.Nil(t, kept.OldestFinished)
	require.Nil(t, kept.OldestDeadLettered)

	_, err = pg.PurgeRetention(ctx, leasing.RetentionPolicy{Finished: time.Minute, MinDedupWindow: time.Hour})
	require.ErrorIs(t, err, leasing.ErrInvalidArgument)
}
