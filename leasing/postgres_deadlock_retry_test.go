package leasing_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
)

// TestDeadlockVictimRetried: a store call that the server aborts as a
// deadlock's victim (SQLSTATE 40P01) is sent again and succeeds, and the
// caller never sees the deadlock. Another transaction locks the batch's
// second row, the store's Complete locks the first and waits for the
// second, and the other transaction then asks for the first: a cycle. The
// other session's deadlock_timeout is 30 s, so the store's backend (1 s)
// checks first and is the victim; its retry waits until the other
// transaction commits and then applies both completes.
func TestDeadlockVictimRetried(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := freshURL(t)
	admin := adminConn(t, url)
	const app = "leasestore-deadlock-retry"
	pool := newPool(t, url, app, 2)
	for _, q := range queuesBoth {
		store, err := leasing.NewPostgres(pool, q, leasing.PostgresOptions{})
		require.NoError(t, err)
		msgs := []leasing.NewMessage{{Topic: "t"}, {Topic: "t"}}
		if q == leasing.Inbox {
			msgs = []leasing.NewMessage{{}, {}}
		}
		_, err = store.Enqueue(ctx, msgs...)
		require.NoError(t, err)
		leases, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 2, LeaseFor: time.Hour})
		require.NoError(t, err)
		require.Len(t, leases, 2)
		if bytes.Compare(leases[0].Message.ID[:], leases[1].Message.ID[:]) > 0 {
			leases[0], leases[1] = leases[1], leases[0]
		}
		first, second := leases[0].Message.ID, leases[1].Message.ID

		other := adminConn(t, url)
		tx, err := other.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "SET LOCAL deadlock_timeout = '30s'")
		require.NoError(t, err)
		touch := "UPDATE " + tableOf(q) + " SET lease_expires_at = lease_expires_at WHERE message_id = $1"
		_, err = tx.Exec(ctx, touch, second)
		require.NoError(t, err)

		done := make(chan error, 1)
		var res leasing.WriteResult
		go func() {
			var err error
			res, err = store.Complete(ctx, leases...)
			done <- err
		}()
		waitForLockWait(t, admin, app) // holds first, waits for second
		_, err = tx.Exec(ctx, touch, first)
		require.NoError(t, err, "%s: the other transaction was the victim; the test expects the store's call to be", q)
		require.NoError(t, tx.Commit(ctx))
		select {
		case err := <-done:
			require.NoError(t, err, "%s: the deadlock reached the caller", q)
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: Complete still waiting after the other transaction committed", q)
		}
		require.NoError(t, res.Err(), q)
		require.Equal(t, 2, res.Count(leasing.OutcomeApplied), q)
	}
}
