package leasing_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
	"github.com/stretchr/testify/require"
)

// TestPostgresContract runs the store contract on PostgreSQL: a database
// of its own per case (migrated, or emptied by the case before it:
// dbtest.RecycledDBs), a new pool per store so that concurrent claims really
// contend from separate connections, and the clock pinned through
// PostgresOptions.Now.
func TestPostgresContract(t *testing.T) {
	t.Parallel()
	runContract(t, &dbtest.RecycledDBs{Owner: t}, nil)
}

// runContract runs the store contract with each case on a database of
// dbs, empty and not shared with another running case, as
// TestPostgresContract describes; its stores connect to via(url) (url
// itself when via is nil).
func runContract(t *testing.T, dbs *dbtest.RecycledDBs, via func(tb testing.TB, url string) string) {
	t.Helper()
	leasingtest.Run(t, func(t *testing.T) leasingtest.Env {
		url := dbs.Get(t)
		if via != nil {
			url = via(t, url)
		}
		clock := leasingtest.NewClock(leasingtest.Start)
		return leasingtest.Env{
			Clock: clock,
			Open: func(tb testing.TB, q leasing.Queue) leasing.Store {
				return dbs.OpenStore(tb, url, q, leasing.PostgresOptions{Now: clock.Now})
			},
		}
	})
}

// TestDatabaseClockDecides uses the real database clock (nothing pinned):
// visibility and expiry come from the server's now(), whatever the caller's
// clock says, because no public call takes a caller's time.
func TestDatabaseClockDecides(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)

	_, err = store.Enqueue(ctx, leasing.NewMessage{Delay: time.Hour}, leasing.NewMessage{})
	require.NoError(t, err)
	var dbBefore time.Time
	require.NoError(t, pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&dbBefore))
	leases, err := store.Claim(ctx, leasing.ClaimRequest{Owner: leasing.NewOwner("w"), BatchSize: 10, LeaseFor: time.Minute})
	require.NoError(t, err)
	var dbAfter time.Time
	require.NoError(t, pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&dbAfter))

	require.Len(t, leases, 1, "the deferred message is not due by the database clock")
	require.False(t, leases[0].ExpiresAt.Before(dbBefore.Add(time.Minute)))
	require.False(t, leases[0].ExpiresAt.After(dbAfter.Add(time.Minute)))
	row, err := store.Get(ctx, leases[0].Message.ID)
	require.NoError(t, err)
	require.False(t, row.LastAttemptedAt.Before(dbBefore))
}

// TestEnqueueInCallerTransaction: messages enqueued in a transaction that
// rolls back never exist; committed ones do (the outbox pattern).
func TestEnqueueInCallerTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	store, err := leasing.NewPostgres(pool, leasing.Outbox, leasing.PostgresOptions{})
	require.NoError(t, err)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	rolledBack, err := store.EnqueueTx(ctx, tx, leasing.NewMessage{Topic: "orders"})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))

	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	committed, err := store.EnqueueTx(ctx, tx, leasing.NewMessage{Topic: "orders"}, leasing.NewMessage{Topic: "orders"})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	_, err = store.Get(ctx, rolledBack.IDs[0])
	require.ErrorIs(t, err, leasing.ErrNotFound)
	for _, id := range committed.IDs {
		row, err := store.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, leasing.StatusPending, row.Status)
	}
}

// TestEnqueueCopy bulk-loads with COPY and claims in input order.
func TestEnqueueCopy(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	for _, q := range []leasing.Queue{leasing.Inbox, leasing.Outbox} {
		store, err := leasing.NewPostgres(pool, q, leasing.PostgresOptions{})
		require.NoError(t, err)
		msgs := make([]leasing.NewMessage, 5000)
		for i := range msgs {
			msgs[i].Payload = []byte{byte(i)}
		}
		var ids []uuid.UUID
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) (err error) { ids, err = store.EnqueueCopy(ctx, tx, msgs...); return err })
		require.NoError(t, err)
		require.Len(t, ids, len(msgs))
		leases, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 5000, LeaseFor: time.Minute})
		require.NoError(t, err)
		got := make([]uuid.UUID, len(leases))
		for i, l := range leases {
			got[i] = l.Message.ID
		}
		require.Equal(t, ids, got, "COPY rows are claimed in input order")

		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := store.EnqueueCopy(ctx, tx, leasing.NewMessage{Delay: time.Second})
			return err
		})
		require.ErrorIs(t, err, leasing.ErrInvalidArgument)
	}
}

// TestCompleteAndClaimIsOneTransaction: when the claim half of
// CompleteAndClaim fails on the server, the complete half rolls back with
// it. A test trigger refuses leases to one owner name, so the claim
// statement fails after the complete statement has run in the same batch.
func TestCompleteAndClaimIsOneTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.NewPool(t)
	_, err := pool.Exec(ctx, `
CREATE FUNCTION refuse_owner() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.lease_owner = 'refused' THEN
        RAISE EXCEPTION 'lease owner refused by test trigger';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_owner BEFORE UPDATE ON inbox_messages FOR EACH ROW EXECUTE FUNCTION refuse_owner();
CREATE TRIGGER refuse_owner BEFORE UPDATE ON outbox_messages FOR EACH ROW EXECUTE FUNCTION refuse_owner();`)
	require.NoError(t, err)
	for _, q := range []leasing.Queue{leasing.Inbox, leasing.Outbox} {
		store, err := leasing.NewPostgres(pool, q, leasing.PostgresOptions{})
		require.NoError(t, err)
		msg := plainMessage(q)
		_, err = store.Enqueue(ctx, msg, msg)
		require.NoError(t, err)
		held, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "a", BatchSize: 1, LeaseFor: time.Minute})
		require.NoError(t, err)
		require.Len(t, held, 1)

		_, next, err := store.CompleteAndClaim(ctx, held, leasing.ClaimRequest{Owner: "refused", BatchSize: 1, LeaseFor: time.Minute})
		require.ErrorContains(t, err, "refused by test trigger", q)
		require.Nil(t, next)
		row, err := store.Get(ctx, held[0].Message.ID)
		require.NoError(t, err)
		require.Equal(t, q.InFlight(), row.Status, "%s: the complete rolled back with the failed claim", q)

		// The pool's connection is usable and a retry with a good owner applies both halves.
		res, next, err := store.CompleteAndClaim(ctx, held, leasing.ClaimRequest{Owner: "a", BatchSize: 1, LeaseFor: time.Minute})
		require.NoError(t, err)
		require.Equal(t, leasing.OutcomeApplied, res.Outcomes[0].Outcome, q)
		require.Len(t, next, 1, q)
		row, err = store.Get(ctx, held[0].Message.ID)
		require.NoError(t, err)
		require.Equal(t, q.Succeeded(), row.Status, q)
	}
}

// TestGenericPlansStayLocal: the store's claim and fenced writes run on
// their generic plans (pg_prepared_statements counts each execution), and
// the plan_cache_mode and lock_timeout the store sets are gone from the
// session afterwards.
func TestGenericPlansStayLocal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t, dbtest.DatabaseURL(t), "leasestore-generic-plans", 1)
	store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	_, err = store.Enqueue(ctx, make([]leasing.NewMessage, 12)...)
	require.NoError(t, err)
	req := leasing.ClaimRequest{Owner: "w", BatchSize: 2, LeaseFor: time.Minute}
	held, err := store.Claim(ctx, req)
	require.NoError(t, err)
	for range 5 {
		_, held, err = store.CompleteAndClaim(ctx, held, req)
		require.NoError(t, err)
		require.Len(t, held, 2)
	}
	_, err = store.Renew(ctx, time.Minute, held...)
	require.NoError(t, err)
	_, err = store.Complete(ctx, held...)
	require.NoError(t, err)

	_, err = store.Stats(ctx) // and an operator call's settings
	require.NoError(t, err)
	var mode, isolation, lockTimeout string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('plan_cache_mode'), current_setting('default_transaction_isolation'), current_setting('lock_timeout')").Scan(&mode, &isolation, &lockTimeout))
	require.Equal(t, "auto", mode, "the setting must not outlive the store's transactions")
	require.Equal(t, "read committed", isolation, "the session's default is untouched")
	require.Equal(t, "0", lockTimeout, "the lock timeout must not outlive the store's transactions")
	rows, err := pool.Query(ctx, `SELECT substring(statement FROM 'name: (\w+)'), generic_plans, custom_plans
FROM pg_prepared_statements WHERE statement LIKE '-- name: Inbox%'`)
	require.NoError(t, err)
	type counts struct{ generic, custom int64 }
	got := map[string]counts{}
	for rows.Next() {
		var name string
		var c counts
		require.NoError(t, rows.Scan(&name, &c.generic, &c.custom))
		got[name] = c
	}
	require.NoError(t, rows.Err())
	require.Equal(t, counts{generic: 6, custom: 0}, got["InboxClaim"], "%v", got)
	require.Equal(t, counts{generic: 6, custom: 0}, got["InboxComplete"], "%v", got)
	require.Equal(t, counts{generic: 1, custom: 0}, got["InboxRenew"], "%v", got)
}
