// Package dbtest gives tests and Example functions their own PostgreSQL
// database.
//
// Each call to NewPool or DatabaseURL creates a fresh database cloned from a
// template that goose migrated once per migration hash, so a test costs one
// CREATE DATABASE, not a migration run, and tests never share rows. The
// server comes from TEST_DATABASE_URL, else DATABASE_URL, else a local
// server on 127.0.0.1:5432 (scripts/db-start.sh starts one). Templates are
// named leasestore_tpl_<hash> and kept across runs.
//
// Nothing else outlives a run. Test databases are named
// leasestore_test_<run>_<random> and per-test roles (RoleName)
// leasestore_t_<run>_<random>, where <run> identifies the test process. A
// test drops what it created in t.Cleanup. A process that dies before its
// cleanups ran (a panic, go test -timeout, SIGKILL) leaves its objects
// behind; the next process to use the server drops them (see Sweep). Main
// also drops the run's objects on SIGINT and SIGTERM before the process
// exits.
//
// A run is alive while its process holds a session advisory lock on the
// maintenance database, keyed by the run: a sweep drops a run's objects only
// after taking that lock itself, so concurrent test processes (also on other
// hosts) never drop each other's databases or roles.
//
// Example functions get theirs from ExamplePool, under ExampleMain
// (examples.go). The store and integration tests share the helpers of
// store.go and roles.go (pools, admin connections, roles from
// db/roles.sql, recycled databases, the -stress flag); PgBouncerURL
// puts a transaction-pooling PgBouncer in front of a test database.
// Every test package's TestMain runs Main or ExampleMain.
package dbtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/db"
	"github.com/leasestore/leasestore/internal/pgadmin"
)

// DefaultURL is the server used when neither TEST_DATABASE_URL nor
// DATABASE_URL is set: the one scripts/db-start.sh starts.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// templateLockKey is the pg_advisory_lock key held while a template is
// built, so that test binaries running at once build each template once.
const templateLockKey int64 = 0x6c65617365746d70 // "leasetmp"

var (
	pingOnce sync.Once
	pingErr  error

	templateMu   sync.Mutex
	templateName string
)

// URL returns the URL of the server's maintenance database, from
// TEST_DATABASE_URL, else DATABASE_URL, else DefaultURL.
//
// When the server cannot be reached the test is skipped, or fails when the
// environment has CI=true, so that CI never passes by skipping. With -short
// the test is skipped without trying.
func URL(tb testing.TB) string {
	tb.Helper()
	if testing.Short() {
		tb.Skip("dbtest: -short skips tests that need PostgreSQL")
	}
	u := serverURL()
	pingOnce.Do(func() {
		pingErr = pgadmin.Ping(u)
		if pingErr == nil {
			// Leftovers of dead runs; a failed sweep only leaves them for
			// the next run, so it does not fail the test.
			if err := Sweep(u); err != nil {
				tb.Logf("dbtest: sweep leftovers of earlier runs: %v", err)
			}
		}
	})
	if pingErr != nil {
		msg := fmt.Sprintf("dbtest: PostgreSQL at %s is not reachable (%v); "+
			"run scripts/db-start.sh or set TEST_DATABASE_URL", pgadmin.Redact(u), pingErr)
		if os.Getenv("CI") == "true" {
			tb.Fatal(msg)
		}
		tb.Skip(msg)
	}
	return u
}

// NewPool returns a pool on a fresh, fully migrated database that is dropped
// when the test ends. The pool is closed before the drop.
func NewPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	pool, err := pgxpool.New(tb.Context(), DatabaseURL(tb))
	if err != nil {
		tb.Fatalf("dbtest: open pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// DatabaseURL returns the URL of a fresh, fully migrated database that is
// dropped (WITH (FORCE)) when the test ends. Use it to open several pools or
// processes on one database.
func DatabaseURL(tb testing.TB) string {
	tb.Helper()
	admin := URL(tb)
	tpl, err := ensureTemplate(tb.Context(), admin)
	if err != nil {
		tb.Fatalf("dbtest: build template database: %v", err)
	}
	return createDatabase(tb, admin, tpl)
}

// NewEmptyDatabase returns the URL of a fresh database without the schema,
// for tests that run the migrations themselves. It is dropped when the test
// ends.
func NewEmptyDatabase(tb testing.TB) string {
	tb.Helper()
	return createDatabase(tb, URL(tb), "template0")
}

// createDatabase creates a database named for this run from template,
// registers its drop and returns its URL.
func createDatabase(tb testing.TB, admin, template string) string {
	tb.Helper()
	name, u, err := newTestDatabase(tb.Context(), admin, template)
	if err != nil {
		tb.Fatalf("dbtest: create database: %v", err)
	}
	tb.Cleanup(func() {
		if err := pgadmin.DropDatabase(admin, name); err != nil {
			tb.Errorf("dbtest: drop database %s: %v", name, err)
		}
	})
	return u
}

// ensureTemplate returns the name of the migrated template database for the
// embedded migrations, building it first if no process has. It builds under
// a temporary name and renames when done, so a template that exists is
// complete.
func ensureTemplate(ctx context.Context, admin string) (string, error) {
	templateMu.Lock()
	defer templateMu.Unlock()
	if templateName != "" {
		return templateName, nil
	}
	hash, err := migrationHash()
	if err != nil {
		return "", err
	}
	name := "leasestore_tpl_" + hash[:12]
	build := name + "_build"

	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.Background()) // also releases the advisory lock
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", templateLockKey); err != nil {
		return "", fmt.Errorf("advisory lock: %w", err)
	}
	var exists bool
	err = conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists)
	if err != nil {
		return "", err
	}
	if !exists {
		if err := buildTemplate(ctx, conn, admin, build, name); err != nil {
			return "", err
		}
	}
	templateName = name
	return name, nil
}

// buildTemplate creates database build, migrates it and renames it to name.
// The caller holds the template lock, so a leftover build is a crashed run's.
func buildTemplate(ctx context.Context, conn *pgx.Conn, admin, build, name string) error {
	stmts := []string{
		"DROP DATABASE IF EXISTS " + ident(build) + " WITH (FORCE)",
		"CREATE DATABASE " + ident(build) + " TEMPLATE template0",
	}
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return err
		}
	}
	buildURL, err := pgadmin.WithDatabase(admin, build)
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, buildURL)
	if err != nil {
		return err
	}
	_, err = db.MigrateUp(ctx, pool)
	pool.Close()
	if err != nil {
		return err
	}
	// No connections to a template: CREATE DATABASE refuses to copy a
	// database that someone is connected to.
	stmts = []string{
		"ALTER DATABASE " + ident(build) + " WITH IS_TEMPLATE true ALLOW_CONNECTIONS false",
		"ALTER DATABASE " + ident(build) + " RENAME TO " + ident(name),
	}
	for _, s := range stmts {
		if _, err := conn.Exec(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

// migrationHash returns the hex SHA-256 of the embedded migration files'
// names and contents and of the version table they are recorded in.
func migrationHash() (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00", db.VersionTable)
	err := fs.WalkDir(db.Migrations(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(db.Migrations(), path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", path, len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("hash migrations: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func ident(name string) string { return pgx.Identifier{name}.Sanitize() }
