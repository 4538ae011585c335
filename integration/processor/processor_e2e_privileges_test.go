package processor_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// runUntilItStops runs a processor over store with handler and returns
// Run's error once Run returns on its own; it fails the test when Run has
// not returned after 30 seconds.
func runUntilItStops(t *testing.T, store *leasing.Postgres, h processor.Handler) error {
	t.Helper()
	p, err := processor.New(store, h, processor.Options{
		Owner: "privileges", Concurrency: 1, BatchSize: 1, PollInterval: 20 * time.Millisecond,
	})
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() { errc <- p.Run(context.Background()) }()
	select {
	case err := <-errc:
		return err
	case <-time.After(30 * time.Second):
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = p.Stop(ctx)
		require.FailNow(t, "Run did not return on its own")
		return nil
	}
}

// refusedCalls returns the names of pe's refused calls, in order.
func refusedCalls(pe *leasing.PrivilegeError) []string {
	var calls []string
	for _, r := range pe.Refused {
		calls = append(calls, r.Call)
	}
	return calls
}

// TestProcessorPrivileges: a processor connecting as a role that may claim
// but not write every outcome runs no handler, instead of running each
// again after every lease expiry.
func TestProcessorPrivileges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("RefusesARoleWithoutTheKeysRights", func(t *testing.T) {
		t.Parallel()
		url := dbtest.DatabaseURL(t)
		admin := openStore(t, url, leasing.Inbox, leasing.PostgresOptions{})
		_, err := admin.Enqueue(ctx, leasing.NewMessage{Type: "t", OrderingKey: "order-1"}, leasing.NewMessage{Type: "t"})
		require.NoError(t, err)
		// Rights on the messages table only, as a hand-made role of a
		// schema before ordering keys had.
		role := grantedRole(t, url, "SELECT, INSERT, UPDATE ON inbox_messages")
		limited := openStore(t, asUser(t, url, role), leasing.Inbox, leasing.PostgresOptions{SkipSchemaCheck: true})

		err = limited.CheckPrivileges(ctx)
		var pe *leasing.PrivilegeError
		require.ErrorAs(t, err, &pe)
		require.ErrorIs(t, err, leasing.ErrPermissionDenied)
		require.Equal(t, role, pe.User)
		require.Equal(t, leasing.Inbox, pe.Queue)
		require.Equal(t, []string{"free ordering keys"}, refusedCalls(pe))
		for _, r := range pe.Refused {
			require.True(t, isPermissionDenied(r.Err), "%s: %v", r.Call, r.Err)
		}
		require.ErrorContains(t, err, `a processor of inbox logged in as "`+role+`" may not free ordering keys (permission denied for table inbox_ordering_keys)`)

		before := tableDigest(t, adminConn(t, url))
		var handled atomic.Int32
		err = runUntilItStops(t, limited, func(context.Context, leasing.Lease) error { handled.Add(1); return nil })
		require.ErrorAs(t, err, &pe)
		require.ErrorContains(t, err, "free ordering keys (permission denied for table inbox_ordering_keys)")
		require.Zero(t, handled.Load(), "no handler ran")
		require.Equal(t, before, tableDigest(t, adminConn(t, url)), "nothing claimed")
	})

	t.Run("AcceptsTheProcessorRole", func(t *testing.T) {
		t.Parallel()
		url := dbtest.DatabaseURL(t)
		applyRoles(t, url)
		login := asUser(t, url, loginRole(t, url, "leasestore_processor"))
		for _, q := range []leasing.Queue{leasing.Inbox, leasing.Outbox} {
			require.NoError(t, openStore(t, login, q, leasing.PostgresOptions{}).CheckPrivileges(ctx), "%s", q)
		}
		// Without INSERT (a processor that never enqueues) as well.
		role := grantedRole(t, url, "SELECT, UPDATE ON outbox_messages",
			"SELECT, UPDATE, DELETE ON outbox_ordering_keys", "SELECT ON leasestore_queue_settings")
		require.NoError(t, openStore(t, asUser(t, url, role), leasing.Outbox, leasing.PostgresOptions{SkipSchemaCheck: true}).CheckPrivileges(ctx))
		// The check runs every statement and changed nothing.
		_, err := openStore(t, url, leasing.Outbox, leasing.PostgresOptions{}).Enqueue(ctx, leasing.NewMessage{Type: "t", Topic: "x"})
		require.NoError(t, err)
		before := tableDigest(t, adminConn(t, url))
		require.NoError(t, openStore(t, login, leasing.Outbox, leasing.PostgresOptions{}).CheckPrivileges(ctx))
		require.Equal(t, before, tableDigest(t, adminConn(t, url)))
	})

	t.Run("RefusesEachMissingGrant", func(t *testing.T) {
		// The processor's grants, each left out in turn, on both queues.
		t.Parallel()
		url := dbtest.DatabaseURL(t)
		// A leased row whose owner is empty (the schema allows it): the
		// check's orphan sweep must not take it, nor anything else.
		_, err := adminConn(t, url).Exec(ctx, `INSERT INTO outbox_messages (message_id, topic, message_type, payload, status, lease_owner, lease_expires_at)
		                                        VALUES (gen_random_uuid(), 't', 't', '', 'publishing', '', now() + interval '1 hour')`)
		require.NoError(t, err)
		before := tableDigest(t, adminConn(t, url))
		for _, q := range []leasing.Queue{leasing.Inbox, leasing.Outbox} {
			grants := []string{
				"SELECT ON " + q.Table(), "UPDATE ON " + q.Table(),
				"SELECT ON " + q.KeyTable(), "UPDATE ON " + q.KeyTable(), "DELETE ON " + q.KeyTable(),
				"SELECT ON leasestore_queue_settings",
			}
			all := grantedRole(t, url, grants...)
			require.NoError(t, openStore(t, asUser(t, url, all), q, leasing.PostgresOptions{SkipSchemaCheck: true}).CheckPrivileges(ctx), "%s", q)
			for i, left := range grants {
				role := grantedRole(t, url, slices.Delete(slices.Clone(grants), i, i+1)...)
				err := openStore(t, asUser(t, url, role), q, leasing.PostgresOptions{SkipSchemaCheck: true}).CheckPrivileges(ctx)
				var pe *leasing.PrivilegeError
				require.ErrorAs(t, err, &pe, "%s without %s", q, left)
				want := []string{"free ordering keys"}
				if i < 2 { // the messages table's: every call
					want = []string{"claim", "renew", "release", "release orphans", map[leasing.Queue]string{leasing.Inbox: "complete", leasing.Outbox: "publish"}[q], "fail", "dead letter", "free ordering keys"}
				}
				require.Equal(t, want, refusedCalls(pe), "%s without %s", q, left)
			}
		}
		require.Equal(t, before, tableDigest(t, adminConn(t, url)), "the checks changed nothing")
	})

	t.Run("ChecksColumns", func(t *testing.T) {
		// db/roles.sql's column grants less one column that only the
		// complete writes: the complete is refused, the claim is not.
		t.Parallel()
		url := dbtest.DatabaseURL(t)
		role := grantedRole(t, url, "SELECT ON inbox_messages",
			"UPDATE (status, visible_after, lease_owner, lease_expires_at, lease_generation, outcome_generation, outcome, "+
				"attempt_count, last_attempted_at, last_error, dead_lettered_at, attempts, key_seq) ON inbox_messages",
			"SELECT, UPDATE, DELETE ON inbox_ordering_keys", "SELECT ON leasestore_queue_settings")
		err := openStore(t, asUser(t, url, role), leasing.Inbox, leasing.PostgresOptions{SkipSchemaCheck: true}).CheckPrivileges(ctx)
		var pe *leasing.PrivilegeError
		require.ErrorAs(t, err, &pe)
		require.Equal(t, []string{"complete"}, refusedCalls(pe))
		// SELECT of some columns only: the claim returns every column.
		role = grantedRole(t, url, "SELECT (message_id, status) ON inbox_messages", "UPDATE ON inbox_messages",
			"SELECT, UPDATE, DELETE ON inbox_ordering_keys", "SELECT ON leasestore_queue_settings")
		err = openStore(t, asUser(t, url, role), leasing.Inbox, leasing.PostgresOptions{SkipSchemaCheck: true}).CheckPrivileges(ctx)
		require.ErrorAs(t, err, &pe)
		require.Contains(t, refusedCalls(pe), "claim")
	})

	t.Run("StopsWhenAWriteIsRefused", func(t *testing.T) {
		// The keys' table rights revoked while the processor runs: the
		// complete of the keyed head is refused, and the processor stops
		// rather than run the handler again after the lease expires.
		t.Parallel()
		url := dbtest.DatabaseURL(t)
		admin := openStore(t, url, leasing.Inbox, leasing.PostgresOptions{})
		res, err := admin.Enqueue(ctx, leasing.NewMessage{Type: "t", OrderingKey: "order-1"}, leasing.NewMessage{Type: "t", OrderingKey: "order-1"})
		require.NoError(t, err)
		role := grantedRole(t, url, "SELECT, UPDATE ON inbox_messages",
			"SELECT, UPDATE, DELETE ON inbox_ordering_keys", "SELECT ON leasestore_queue_settings")
		limited := openStore(t, asUser(t, url, role), leasing.Inbox, leasing.PostgresOptions{SkipSchemaCheck: true})
		superuser := adminConn(t, url)

		var handled atomic.Int32
		err = runUntilItStops(t, limited, func(ctx context.Context, l leasing.Lease) error {
			if handled.Add(1) == 1 {
				_, err := superuser.Exec(ctx, "REVOKE UPDATE ON inbox_ordering_keys FROM "+pgx.Identifier{role}.Sanitize())
				require.NoError(t, err)
			}
			return nil
		})
		require.ErrorIs(t, err, leasing.ErrPermissionDenied)
		require.ErrorContains(t, err, "stopped: the database refused an outcome write")
		require.ErrorContains(t, err, "inbox_ordering_keys")
		require.EqualValues(t, 1, handled.Load(), "the handler ran once")
		head, err := admin.Get(ctx, res.IDs[0])
		require.NoError(t, err)
		require.Equal(t, leasing.Inbox.InFlight(), head.Status, "its outcome was not written: the lease expires")
		require.EqualValues(t, 1, head.AttemptCount)
		next, err := admin.Get(ctx, res.IDs[1])
		require.NoError(t, err)
		require.Equal(t, leasing.StatusWaiting, next.Status)
	})
}
