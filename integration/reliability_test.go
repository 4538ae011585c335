package integration

import (
	"context"
	"errors"
	"flag"
	"os"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
)

// stressFlag selects the long forms of the reliability tests (stress,
// faults, differential): `cd integration && go test -args -stress`, as
// `make stress` runs them. LEASESTORE_STRESS=1 does the same.
var stressFlag = flag.Bool("stress", false, "run the long forms of the stress, fault and differential tests")

// long reports whether the long forms were asked for.
func long() bool {
	return *stressFlag || os.Getenv("LEASESTORE_STRESS") == "1"
}

// pick returns short in the always-on form and long under -stress.
func pick[T any](short, long_ T) T {
	if long() {
		return long_
	}
	return short
}

var queuesBoth = []leasing.Queue{leasing.Inbox, leasing.Outbox}

// tableOf returns the table a queue lives in.
func tableOf(q leasing.Queue) string {
	if q == leasing.Outbox {
		return "outbox_messages"
	}
	return "inbox_messages"
}

// newPool opens a pool on url with at most maxConns connections and the
// given application_name (so that fault injectors can find its backends),
// closed when the test ends.
func newPool(tb testing.TB, url, appName string, maxConns int32) *pgxpool.Pool {
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

// adminConn returns a superuser connection to the database at url, closed
// when the test ends.
func adminConn(tb testing.TB, url string) *pgx.Conn {
	tb.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// tableDigest is an md5 of every row of both tables, in key order: equal
// digests mean nothing changed.
func tableDigest(tb testing.TB, db interface {
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

// freshURL is dbtest.DatabaseURL; a name to read well at call sites.
func freshURL(tb testing.TB) string { return dbtest.DatabaseURL(tb) }

// isArgErr reports whether err is a leasing argument error.
func isArgErr(err error) bool {
	var ae *leasing.ArgumentError
	return errors.As(err, &ae) && errors.Is(err, leasing.ErrInvalidArgument)
}

// recycledDBs hands out migrated databases and takes them back emptied
// (truncateQueues) when the borrowing test ends, so that a suite of many small
// cases pays for a few CREATE DATABASE instead of one per case. The
// databases belong to owner, whose end drops them. A database whose
// borrower failed is not reused.
type recycledDBs struct {
	owner testing.TB
	// prepare, when not nil, runs once on each new database.
	prepare func(tb testing.TB, url string)

	mu   sync.Mutex
	free []string
}

// get returns a database with empty tables for tb.
func (r *recycledDBs) get(tb testing.TB) string {
	tb.Helper()
	r.mu.Lock()
	var url string
	if n := len(r.free); n > 0 {
		url, r.free = r.free[n-1], r.free[:n-1]
	}
	r.mu.Unlock()
	if url == "" {
		url = dbtest.DatabaseURL(r.owner)
		if r.prepare != nil {
			r.prepare(tb, url)
		}
	}
	// Registered before the borrower opens pools, so it runs after they close.
	tb.Cleanup(func() { r.put(tb, url) })
	return url
}

func (r *recycledDBs) put(tb testing.TB, url string) {
	if tb.Failed() {
		return
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, truncateQueues); err != nil {
		return
	}
	r.mu.Lock()
	r.free = append(r.free, url)
	r.mu.Unlock()
}

// truncateQueues empties both queues, their ordering keys, and sets strict
// ordering back to its default: a database as migrated.
const truncateQueues = "TRUNCATE inbox_messages, outbox_messages, inbox_ordering_keys, outbox_ordering_keys; " +
	"UPDATE leasestore_queue_settings SET strict_ordering = false"
