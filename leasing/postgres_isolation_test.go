package leasing_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/internal/doctor"
	"github.com/leasestore/leasestore/leasing"
)

// Every store statement runs at READ COMMITTED, whatever
// default_transaction_isolation the database, the role or the session
// sets. Under repeatable read or serializable, a statement that waits for a
// row lock and then finds the row updated by the transaction it waited for
// fails with a serialization failure (SQLSTATE 40001) instead of checking
// the new version; concurrent claims, writes and enqueues meet the same
// failures, and serializable adds failures for what the statements read.

// isolationLevels are the defaults the tests set, as SHOW prints them.
var isolationLevels = []string{"serializable", "repeatable read"}

// isolationScopes are where the tests set the default.
var isolationScopes = []string{"database", "role", "session"}

// isolationStore returns an inbox store (LockTimeout 30s, so that the
// row-lock waits below never time out) whose pool has application_name app,
// on a fresh database where new transactions default to level, set at
// scope: ALTER DATABASE, ALTER ROLE (a superuser role of the test's own),
// or the connection's startup parameters. It also returns the database's
// URL, as the pool's user.
func isolationStore(t *testing.T, level, scope, app string) (*leasing.Postgres, string) {
	t.Helper()
	ctx := context.Background()
	u := dbtest.DatabaseURL(t)
	parsed, err := pgx.ParseConfig(u)
	require.NoError(t, err)
	admin := adminConn(t, u)
	setting := "default_transaction_isolation = '" + level + "'"
	switch scope {
	case "database":
		_, err = admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{parsed.Database}.Sanitize()+" SET "+setting)
		require.NoError(t, err)
	case "role":
		role := dbtest.RoleName(t)
		ident := pgx.Identifier{role}.Sanitize()
		_, err = admin.Exec(ctx, "CREATE ROLE "+ident+" LOGIN SUPERUSER")
		require.NoError(t, err)
		t.Cleanup(func() {
			if err := dropRole(dbtest.URL(t), role); err != nil {
				t.Errorf("drop role %s: %v", role, err)
			}
		})
		_, err = admin.Exec(ctx, "ALTER ROLE "+ident+" SET "+setting)
		require.NoError(t, err)
		u = asUser(t, u, role)
	}
	cfg, err := pgxpool.ParseConfig(u)
	require.NoError(t, err)
	cfg.MaxConns = 12
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	if scope == "session" {
		cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = level
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var got string
	require.NoError(t, pool.QueryRow(ctx, "SHOW transaction_isolation").Scan(&got))
	require.Equal(t, level, got, "the %s default is in effect for plain statements", scope)
	store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{LockTimeout: 30 * time.Second})
	require.NoError(t, err)
	return store, u
}

// TestIsolationDefaults runs, for each default and each place it is set,
// on a database of its own: every call that may wait for a row lock, while
// another transaction updates that row and commits (the case repeatable
// read and serializable turn into a serialization failure), then a
// concurrent workload of every store call and doctor's checks. No call may
// fail.
func TestIsolationDefaults(t *testing.T) {
	t.Parallel()
	for _, level := range isolationLevels {
		for _, scope := range isolationScopes {
			t.Run(fmt.Sprintf("%s/%s", scope, level), func(t *testing.T) {
				app := "leasestore-isolation-" + uuid.NewString()[:8]
				store, u := isolationStore(t, level, scope, app)
				isolationRowLockWaits(t, store, u, app)
				isolationWorkload(t, store, pick(2*time.Second, 30*time.Second))
			})
		}
	}
}

// isolationRowLockWaits runs each call that waits for row locks (claims,
// purges and orphan sweeps skip locked rows instead) while a READ
// COMMITTED transaction of the test holds the lock of the row the call
// needs, having updated it; once the call waits for that lock, the
// transaction commits. The call must then go on with the row's new version
// and succeed.
func isolationRowLockWaits(t *testing.T, store *leasing.Postgres, u, app string) {
	ctx := context.Background()
	locker := adminConn(t, u)
	watcher := adminConn(t, u)
	const leaseFor = time.Minute

	// claimOne enqueues one message of tenant and claims it for owner.
	claimOne := func(t *testing.T, tenant, owner string) leasing.Lease {
		t.Helper()
		_, err := store.Enqueue(ctx, leasing.NewMessage{Type: "isolation", TenantID: tenant})
		require.NoError(t, err)
		leases, err := store.Claim(ctx, leasing.ClaimRequest{Owner: owner, BatchSize: 1, LeaseFor: leaseFor, TenantID: tenant})
		require.NoError(t, err)
		require.Len(t, leases, 1)
		return leases[0]
	}
	applied := func(res leasing.WriteResult, err error) error {
		if err != nil {
			return err
		}
		if err := res.Err(); err != nil {
			return err
		}
		if n := res.Count(leasing.OutcomeApplied); n != 1 {
			return fmt.Errorf("applied %d, want 1: %+v", n, res.Outcomes)
		}
		return nil
	}
	cases := []struct {
		name string
		// prepare returns the id whose row the call locks, and the call.
		prepare func(t *testing.T, tenant string) (uuid.UUID, func() error)
	}{
		{"Renew", func(t *testing.T, tenant string) (uuid.UUID, func() error) {
			l := claimOne(t, tenant, "w")
			return l.Message.ID, func() error {
				res, err := store.Renew(ctx, leaseFor, l)
				return errors.Join(err, res.Err())
			}
		}},
		{"Release", func(t *testing.T, tenant string) (uuid.UUID, func() error) {
			l := claimOne(t, tenant, "w")
			return l.Message.ID, func() error { return applied(store.Release(ctx, l)) }
		}},
		{"Complete", func(t *testing.T, tenant string) (uuid.UUID, func() error) {
			l := claimOne(t, tenant, "w")
			return l.Message.ID, func() error { return applied(store.Complete(ctx, l)) }
		}},
		{"CompleteAndClaim", func(t *testing.T, tenant string) (uuid.UUID, func() error) {
			l := claimOne(t, tenant, "w")
			return l.Message.ID, func() error {
				res, _, err := store.CompleteAndClaim(ctx, []leasing.Lease{l}, leasing.ClaimRequest{Owner: "w", BatchSize: 1, LeaseFor: leaseFor, TenantID: tenant})
				return applied(res, err)
			}
		}},
		{"Fail", func(t *testing.T, tenant string) (uuid.UUID, func() error) {
			l := claimOne(t, tenant, "w")
			return l.Message.ID, func() error {
				return applied(store.Fail(ctx, leasing.Failure{Lease: l, RetryAfter: time.Hour, Error: "boom"}))
			}
		}},
		{"DeadLetter", func(t *testing.T, tenant string) (uuid.UUID, func() error) {
			l := claimOne(t, tenant, "w")
			return l.Message.ID, func() error { return applied(store.DeadLetter(ctx, leasing.Failure{Lease: l, Error: "poison"})) }
		}},
		{"Requeue", func(t *testing.T, tenant string) (uuid.UUID, func() error) {
			l := claimOne(t, tenant, "w")
			require.NoError(t, applied(store.DeadLetter(ctx, leasing.Failure{Lease: l, Error: "poison"})))
			return l.Message.ID, func() error {
				res, err := store.Requeue(ctx, l.Message.ID)
				if err == nil && (len(res.Requeued) != 1 || res.Requeued[0] != l.Message.ID) {
					err = fmt.Errorf("requeued %v, want [%s]", res.Requeued, l.Message.ID)
				}
				return err
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			id, call := c.prepare(t, c.name)
			tx, err := locker.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			// A new version of the row, same values, locked until commit.
			_, err = tx.Exec(ctx, "UPDATE inbox_messages SET payload = payload WHERE message_id = $1", id)
			require.NoError(t, err)
			callErr := make(chan error, 1)
			go func() { callErr <- call() }()
			waitForLockWait(t, watcher, app)
			require.NoError(t, tx.Commit(ctx))
			err = <-callErr
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) {
				t.Logf("SQLSTATE %s", pgErr.Code)
			}
			require.NoError(t, err, "%s after waiting for a row that another transaction updated", c.name)
		})
	}
}

// isolationWorkload runs, for d, every store call from several goroutines
// on one queue: enqueues, claims, renews, completes (alone and with the
// next claim), fails, dead letters, releases, orphan sweeps, requeues by id
// and of all, purges, stats, gets, lists and doctor's checks. Every call
// must succeed, and every fenced write of a live lease must apply.
func isolationWorkload(t *testing.T, store *leasing.Postgres, d time.Duration) {
	ctx := context.Background()
	var (
		mu       sync.Mutex
		failures []error
		dead     []uuid.UUID
	)
	fail := func(op string, err error) {
		mu.Lock()
		defer mu.Unlock()
		failures = append(failures, fmt.Errorf("%s: %w", op, err))
	}
	stop := make(chan struct{})
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	var wg sync.WaitGroup
	spawn := func(n int, fn func(i int)) {
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stopped() {
					fn(i)
				}
			}()
		}
	}
	spawn(3, func(int) { // producers
		msgs := make([]leasing.NewMessage, 10)
		for i := range msgs {
			msgs[i] = leasing.NewMessage{Type: "workload", IdempotencyKey: uuid.NewString()}
		}
		if _, err := store.Enqueue(ctx, msgs...); err != nil {
			fail("enqueue", err)
		}
		time.Sleep(5 * time.Millisecond)
	})
	spawn(4, func(i int) { // workers
		owner := fmt.Sprintf("worker-%d", i)
		leases, err := store.Claim(ctx, leasing.ClaimRequest{Owner: owner, BatchSize: 8, LeaseFor: time.Minute})
		if err != nil {
			fail("claim", err)
			return
		}
		if len(leases) == 0 {
			time.Sleep(2 * time.Millisecond)
			return
		}
		if res, err := store.Renew(ctx, time.Minute, leases...); err != nil || res.Err() != nil {
			fail("renew", errors.Join(err, res.Err()))
		}
		var complete, release []leasing.Lease
		var failed, deadLettered []leasing.Failure
		for _, l := range leases {
			h := fnv.New32a()
			_, _ = h.Write(l.Message.ID[:])
			switch {
			case l.Generation > 1 || h.Sum32()%5 == 0:
				complete = append(complete, l)
			case h.Sum32()%5 == 1:
				release = append(release, l)
			case h.Sum32()%5 == 2:
				failed = append(failed, leasing.Failure{Lease: l, Error: "retry me"})
			case h.Sum32()%5 == 3:
				deadLettered = append(deadLettered, leasing.Failure{Lease: l, Error: "poison"})
				mu.Lock()
				dead = append(dead, l.Message.ID)
				mu.Unlock()
			default:
				complete = append(complete, l)
			}
		}
		check := func(op string, res leasing.WriteResult, err error) {
			if err != nil || res.Err() != nil {
				fail(op, errors.Join(err, res.Err()))
			}
		}
		if len(release) > 0 {
			res, err := store.Release(ctx, release...)
			check("release", res, err)
		}
		if len(failed) > 0 {
			res, err := store.Fail(ctx, failed...)
			check("fail", res, err)
		}
		if len(deadLettered) > 0 {
			res, err := store.DeadLetter(ctx, deadLettered...)
			check("dead letter", res, err)
		}
		if len(complete) > 0 {
			if i%2 == 0 {
				res, err := store.Complete(ctx, complete...)
				check("complete", res, err)
				return
			}
			res, more, err := store.CompleteAndClaim(ctx, complete, leasing.ClaimRequest{Owner: owner, BatchSize: 2, LeaseFor: time.Minute})
			check("complete and claim", res, err)
			if err == nil && len(more) > 0 {
				res, err := store.Complete(ctx, more...)
				check("complete", res, err)
			}
		}
	})
	spawn(1, func(int) { // operator
		mu.Lock()
		ids := append([]uuid.UUID(nil), dead...)
		dead = dead[:0]
		mu.Unlock()
		if len(ids) > 0 {
			if _, err := store.Requeue(ctx, ids[:min(len(ids), leasing.MaxBatchSize)]...); err != nil {
				fail("requeue", err)
			}
		}
		if _, err := store.RequeueAll(ctx); err != nil {
			fail("requeue all", err)
		}
		if _, err := store.Purge(ctx, leasing.PurgeRequest{OlderThan: time.Microsecond, BatchSize: 50, IncludeDeadLettered: len(ids)%2 == 0}); err != nil {
			fail("purge", err)
		}
		if _, err := store.ReleaseOrphans(ctx, "nobody", nil); err != nil {
			fail("release orphans", err)
		}
		time.Sleep(10 * time.Millisecond)
	})
	spawn(1, func(int) { // observer
		if _, err := store.Stats(ctx); err != nil {
			fail("stats", err)
		}
		page, err := store.List(ctx, leasing.ListRequest{Limit: 20})
		if err != nil {
			fail("list", err)
		}
		for _, r := range page.Rows[:min(len(page.Rows), 3)] {
			if _, err := store.Get(ctx, r.Message.ID); err != nil && !errors.Is(err, leasing.ErrNotFound) {
				fail("get", err)
			}
		}
		time.Sleep(5 * time.Millisecond)
	})
	spawn(1, func(int) { // doctor
		if _, err := doctor.Check(ctx, store.Pool(), doctor.Options{Queues: []leasing.Queue{leasing.Inbox}}); err != nil {
			fail("doctor", err)
		}
		time.Sleep(100 * time.Millisecond)
	})
	time.Sleep(d)
	close(stop)
	wg.Wait()
	for i, err := range failures {
		if i == 10 {
			t.Errorf("and %d more failed calls", len(failures)-i)
			break
		}
		t.Error(err)
	}
	st, err := store.Stats(ctx)
	require.NoError(t, err)
	require.Positive(t, st.Depth[leasing.StatusCompleted]+st.Depth[leasing.StatusPending], "the workload did work: %+v", st.Depth)
}

// TestEnqueueTxKeepsCallerIsolation: EnqueueTx runs in the caller's
// transaction with its isolation and lock_timeout untouched, so a
// repeatable read transaction that meets an inbox duplicate committed after
// its snapshot gets the serialization failure its level promises.
func TestEnqueueTxKeepsCallerIsolation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, _ := isolationStore(t, "repeatable read", "session", "leasestore-isolation-"+uuid.NewString()[:8])
	settings := func(tx pgx.Tx) (isolation, lockTimeout string) {
		t.Helper()
		require.NoError(t, tx.QueryRow(ctx, "SELECT current_setting('transaction_isolation'), current_setting('lock_timeout')").Scan(&isolation, &lockTimeout))
		return isolation, lockTimeout
	}

	t.Run("SettingsUntouched", func(t *testing.T) {
		tx, err := store.Pool().Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		isolation, lockTimeout := settings(tx)
		require.Equal(t, "repeatable read", isolation)
		_, err = store.EnqueueTx(ctx, tx, leasing.NewMessage{Type: "isolation"})
		require.NoError(t, err)
		isolation2, lockTimeout2 := settings(tx)
		require.Equal(t, isolation, isolation2)
		require.Equal(t, lockTimeout, lockTimeout2, "the store's lock timeout stays out of the caller's transaction")
		require.NoError(t, tx.Commit(ctx))
	})

	t.Run("DuplicateAfterSnapshot", func(t *testing.T) {
		tx, err := store.Pool().Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		settings(tx) // takes the snapshot
		key := uuid.NewString()
		_, err = store.Enqueue(ctx, leasing.NewMessage{Type: "isolation", IdempotencyKey: key})
		require.NoError(t, err)
		_, err = store.EnqueueTx(ctx, tx, leasing.NewMessage{Type: "isolation", IdempotencyKey: key})
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "40001", pgErr.Code, "repeatable read, as the caller chose")
	})

	t.Run("NilTx", func(t *testing.T) {
		_, err := store.EnqueueTx(ctx, nil, leasing.NewMessage{Type: "isolation"})
		require.ErrorIs(t, err, leasing.ErrInvalidArgument)
	})
}

// TestStoreCallsRaiseNoNotices: the store's calls, in each query mode,
// raise no notice on their connection. Each call opens its own READ
// COMMITTED transaction; SET TRANSACTION in a batch's implicit transaction
// would raise a WARNING per call, which the server also logs.
func TestStoreCallsRaiseNoNotices(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"cache_statement", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			cfg, err := pgxpool.ParseConfig(withQueryMode(t, dbtest.DatabaseURL(t), mode))
			require.NoError(t, err)
			var (
				mu      sync.Mutex
				notices []string
			)
			cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
				mu.Lock()
				defer mu.Unlock()
				notices = append(notices, n.Severity+": "+n.Message)
			}
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(pool.Close)
			store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
			require.NoError(t, err)

			f := newLockFixture(t, store, "notices")
			for _, c := range lockCalls(store, f) {
				require.NoError(t, c.call(ctx), c.name)
			}
			require.NoError(t, store.CheckPrivileges(ctx))
			mu.Lock()
			defer mu.Unlock()
			require.Empty(t, notices)
		})
	}
}
