package dbtest

import (
	"context"
	"errors"
	"flag"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
)

// stressFlag selects the long forms of the reliability tests (stress,
// faults, differential): `go test -args -stress`, as `make stress` runs
// them. LEASESTORE_STRESS=1 does the same.
var stressFlag = flag.Bool("stress", false, "run the long forms of the stress, fault and differential tests")

// Long reports whether the long forms were asked for.
func Long() bool {
	return *stressFlag || os.Getenv("LEASESTORE_STRESS") == "1"
}

// Pick returns short in the always-on form and long under -stress.
func Pick[T any](short, long T) T {
	if Long() {
		return long
	}
	return short
}

// Queues are both queues, inbox first.
var Queues = []leasing.Queue{leasing.Inbox, leasing.Outbox}

// TableOf returns the table a queue lives in.
func TableOf(q leasing.Queue) string {
	if q == leasing.Outbox {
		return "outbox_messages"
	}
	return "inbox_messages"
}

// OpenPool opens a pool on url with at most maxConns connections and the
// given application_name (so that fault injectors can find its backends),
// closed when the test ends.
func OpenPool(tb testing.TB, url, appName string, maxConns int32) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(tb, err)
	cfg.MaxConns = maxConns
	if appName != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = appName
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(tb, err)
	tb.Cleanup(pool.Close)
	return pool
}

// AdminConn returns a superuser connection to the database at url, closed
// when the test ends.
func AdminConn(tb testing.TB, url string) *pgx.Conn {
	tb.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// OpenStore opens a store of queue q on a two-connection pool on url,
// closed when the test ends.
func OpenStore(tb testing.TB, url string, q leasing.Queue, opts leasing.PostgresOptions) *leasing.Postgres {
	tb.Helper()
	pool := storePool(tb, url)
	tb.Cleanup(pool.Close)
	return storeOn(tb, pool, q, opts)
}

// storePool opens the two-connection pool on url that OpenStore's stores
// use; the caller closes it.
func storePool(tb testing.TB, url string) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(tb, err)
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(tb, err)
	return pool
}

// storeOn returns a store of queue q on pool.
func storeOn(tb testing.TB, pool *pgxpool.Pool, q leasing.Queue, opts leasing.PostgresOptions) *leasing.Postgres {
	tb.Helper()
	store, err := leasing.NewPostgres(pool, q, opts)
	require.NoError(tb, err)
	return store
}

// TableDigest is an md5 of every row of both tables, in key order: equal
// digests mean nothing changed.
func TableDigest(tb testing.TB, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) string {
	tb.Helper()
	var digest string
	err := db.QueryRow(context.Background(), `
		SELECT md5(coalesce((SELECT string_agg(m::text, '|' ORDER BY message_id) FROM inbox_messages AS m), '') || '#' ||
		           coalesce((SELECT string_agg(m::text, '|' ORDER BY message_id) FROM outbox_messages AS m), ''))`).Scan(&digest)
	require.NoError(tb, err)
	return digest
}

// IsArgErr reports whether err is a leasing argument error.
func IsArgErr(err error) bool {
	var ae *leasing.ArgumentError
	return errors.As(err, &ae) && errors.Is(err, leasing.ErrInvalidArgument)
}

// FailureLeases returns the leases of fs.
func FailureLeases(fs []leasing.Failure) []leasing.Lease {
	out := make([]leasing.Lease, len(fs))
	for i, f := range fs {
		out[i] = f.Lease
	}
	return out
}

// WaitForLockWait waits until a backend with application_name app waits
// on a lock.
func WaitForLockWait(t *testing.T, admin *pgx.Conn, app string) {
	t.Helper()
	waitLockWaiting(t, admin, app, true)
}

// WaitForNoLockWait waits until no backend with application_name app
// waits on a lock: one whose call was cancelled has processed the cancel
// request, which the driver sends after the call returned.
func WaitForNoLockWait(t *testing.T, admin *pgx.Conn, app string) {
	t.Helper()
	waitLockWaiting(t, admin, app, false)
}

// waitLockWaiting waits until whether a backend of app waits on a lock is
// want, for up to 10 seconds.
func waitLockWaiting(t *testing.T, admin *pgx.Conn, app string, want bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var waiting bool
		err := admin.QueryRow(context.Background(), `
			SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			               WHERE application_name = $1 AND wait_event_type = 'Lock')`, app).Scan(&waiting)
		require.NoError(t, err)
		if waiting == want {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	if want {
		t.Fatalf("no backend of %s started waiting on a lock", app)
	}
	t.Fatalf("a backend of %s still waits on a lock", app)
}

// WaitStatus returns a function that polls until the row has status.
func WaitStatus(tb testing.TB, url string, q leasing.Queue, id uuid.UUID, status string) func() {
	return func() {
		conn, err := pgx.Connect(context.Background(), url)
		if err != nil {
			tb.Errorf("wait for commit: %v", err)
			return
		}
		defer conn.Close(context.Background())
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			var got string
			if err := conn.QueryRow(context.Background(), "SELECT status FROM "+TableOf(q)+" WHERE message_id = $1", id).Scan(&got); err == nil && got == status {
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
		tb.Errorf("the statement never committed status %s", status)
	}
}

// RecycledDBs hands out migrated databases and takes them back emptied
// (EmptyQueues) when the borrowing test ends, so that a suite of many
// small cases pays for a few CREATE DATABASE instead of one per case. The
// databases belong to Owner, whose end drops them. A database whose
// borrower failed is not reused.
type RecycledDBs struct {
	Owner testing.TB
	// Init, when not nil, runs once on each new database.
	Init func(tb testing.TB, url string)

	mu    sync.Mutex
	free  []string
	pools map[string][]*pgxpool.Pool // OpenStore's pools no test uses, by URL
	conns map[string]*pgx.Conn       // put's connection to each database, by URL
}

// Get returns a database with empty tables for tb.
func (r *RecycledDBs) Get(tb testing.TB) string {
	tb.Helper()
	r.mu.Lock()
	var url string
	if n := len(r.free); n > 0 {
		url, r.free = r.free[n-1], r.free[:n-1]
	}
	r.mu.Unlock()
	if url == "" {
		url = DatabaseURL(r.Owner)
		if r.Init != nil {
			r.Init(tb, url)
		}
	}
	// Registered before the borrower opens pools, so it runs after they close.
	tb.Cleanup(func() { r.put(tb, url) })
	return url
}

// keptPoolsPerURL is how many idle pools RecycledDBs.OpenStore keeps for
// one URL: most cases open one store, and the pools kept must not leave
// the server short of connections (max_connections is 100 by default).
// The four contract suites of the leasing package peaked at 51 connections
// with one pool kept per URL, 58 with two, 25 with none.
const keptPoolsPerURL = 1

// OpenStore is the package's OpenStore on a pool that outlives tb: once tb
// ends, the next test that opens a store on the same url (a database Get
// returned, as is or through a pooler, a query mode or a role) takes the
// pool again, its connections with their statements prepared and their
// server caches filled. A new connection and its first claim took about
// 50 ms here, against 26 ms for a new connection and SELECT 1; a contract
// case opened one or two. The pools close when Owner ends; a pool tb
// failed with, left a connection acquired in, or beyond keptPoolsPerURL
// closes when tb ends.
func (r *RecycledDBs) OpenStore(tb testing.TB, url string, q leasing.Queue, opts leasing.PostgresOptions) *leasing.Postgres {
	tb.Helper()
	r.mu.Lock()
	var pool *pgxpool.Pool
	if idle := r.pools[url]; len(idle) > 0 {
		pool, r.pools[url] = idle[len(idle)-1], idle[:len(idle)-1]
	}
	r.mu.Unlock()
	if pool == nil {
		pool = storePool(tb, url)
		r.Owner.Cleanup(pool.Close)
	}
	tb.Cleanup(func() {
		r.mu.Lock()
		keep := !tb.Failed() && pool.Stat().AcquiredConns() == 0 && len(r.pools[url]) < keptPoolsPerURL
		if keep {
			if r.pools == nil {
				r.pools = map[string][]*pgxpool.Pool{}
			}
			r.pools[url] = append(r.pools[url], pool)
		}
		r.mu.Unlock()
		if !keep {
			pool.Close()
		}
	})
	return storeOn(tb, pool, q, opts)
}

// put empties the database at url, which tb borrowed, for the next test,
// unless tb failed.
func (r *RecycledDBs) put(tb testing.TB, url string) {
	if tb.Failed() {
		return
	}
	ctx := context.Background()
	r.mu.Lock()
	conn := r.conns[url] // one test at a time borrows url, and uses no other's
	r.mu.Unlock()
	if conn == nil {
		var err error
		if conn, err = pgx.Connect(ctx, url); err != nil {
			return
		}
		r.Owner.Cleanup(func() { _ = conn.Close(context.Background()) })
		r.mu.Lock()
		if r.conns == nil {
			r.conns = map[string]*pgx.Conn{}
		}
		r.conns[url] = conn
		r.mu.Unlock()
	}
	if _, err := conn.Exec(ctx, EmptyQueues); err != nil {
		return
	}
	r.mu.Lock()
	r.free = append(r.free, url)
	r.mu.Unlock()
}

// EmptyQueues deletes every row of both queues, their ordering keys and
// pauses, sets strict ordering back to its default and restarts the work
// signal's rate sequences (the next insert notifies): a database as
// migrated but for the dead row versions of the few rows a case wrote.
// DELETE, not TRUNCATE: TRUNCATE gives every table and index a new file,
// synced at commit, and makes every connection plan its statements again;
// the store contract ran in 13.7 s with it and 8 s without, under -race.
const EmptyQueues = "DELETE FROM inbox_messages; DELETE FROM outbox_messages; DELETE FROM inbox_ordering_keys; DELETE FROM outbox_ordering_keys; DELETE FROM leasestore_paused; " +
	"UPDATE leasestore_queue_settings SET strict_ordering = false; " +
	"ALTER SEQUENCE inbox_messages_work_signal RESTART; ALTER SEQUENCE outbox_messages_work_signal RESTART"
