package main

import (
	"fmt"
	"io/fs"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/db"
	"github.com/leasestore/leasestore/internal/dbtest"
)

// TestMigrateSQL prints the migration files for vendoring, without a
// server: one version exactly as embedded, or all of them in order.
func TestMigrateSQL(t *testing.T) {
	t.Parallel()
	url := unreachableURL(t)
	files, err := fs.Glob(db.Migrations(), "*.sql")
	require.NoError(t, err)
	first, err := fs.ReadFile(db.Migrations(), files[0])
	require.NoError(t, err)

	require.Equal(t, string(first), requireOK(t, "migrate", "sql", "--version", "1", "--database-url", url))

	all := requireOK(t, "migrate", "sql", "--database-url", url)
	at := 0
	for _, name := range files {
		b, err := fs.ReadFile(db.Migrations(), name)
		require.NoError(t, err)
		i := strings.Index(all[at:], "-- leasestore migration "+name)
		require.GreaterOrEqual(t, i, 0, "%s missing or out of order", name)
		at += i
		j := strings.Index(all[at:], string(b))
		require.GreaterOrEqual(t, j, 0, "%s content", name)
		at += j + len(b)
	}

	r := leasectl(t, "migrate", "sql", "--version", "999", "--database-url", url)
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "no such migration")
	r = leasectl(t, "migrate", "up", "--version", "1", "--database-url", url)
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "--version is a flag of migrate sql")
}

// TestMigrateLegacyHistory runs migrate status on a database that an older
// leasectl migrated, its history in goose_db_version: the history moves to
// leasestore_db_version and nothing is pending.
func TestMigrateLegacyHistory(t *testing.T) {
	t.Parallel()
	url := dbtest.NewEmptyDatabase(t)
	pool, err := pgxpool.New(t.Context(), url)
	require.NoError(t, err)
	defer pool.Close()
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	legacy, err := goose.NewProvider(goose.DialectPostgres, sqlDB, db.Migrations())
	require.NoError(t, err)
	_, err = legacy.Up(t.Context())
	require.NoError(t, err)

	var versions []int64
	for _, s := range legacy.ListSources() {
		versions = append(versions, s.Version)
	}
	out := requireOK(t, "migrate", "status", "--database-url", url)
	require.Contains(t, out, fmt.Sprintf("moved the history of versions %v from goose_db_version to leasestore_db_version", versions))
	require.Contains(t, out, "0 pending")
	out = requireOK(t, "migrate", "up", "--database-url", url)
	require.NotContains(t, out, "moved")
	require.Contains(t, out, "no pending migrations")
}

// TestMigrate runs migrate status, up, down and up again on an empty database.
func TestMigrate(t *testing.T) {
	t.Parallel()
	url := dbtest.NewEmptyDatabase(t)
	files, err := fs.Glob(db.Migrations(), "*.sql")
	require.NoError(t, err)
	n := len(files)
	require.Positive(t, n)

	// The latest version is the last file's number, which is n only when
	// no number is missing (branches may add migrations out of order).
	var latestVersion int
	_, err = fmt.Sscanf(files[n-1], "%05d_", &latestVersion)
	require.NoError(t, err)
	out := requireOK(t, "migrate", "status", "--database-url", url)
	require.Contains(t, out, fmt.Sprintf("schema version 0 (latest %d, %d pending)", latestVersion, n))
	require.Equal(t, n, strings.Count(out, "pending  -"))

	out = requireOK(t, "--database-url", url, "migrate", "up")
	require.Equal(t, n, strings.Count(out, "OK    up"))
	latest := strings.TrimSuffix(files[n-1], ".sql")
	require.Contains(t, out, latest)

	out = requireOK(t, "migrate", "--database-url", url, "status")
	require.Contains(t, out, "0 pending")
	require.Equal(t, n, strings.Count(out, "applied  "))

	out = requireOK(t, "migrate", "up", "--database-url", url)
	require.Contains(t, out, "no pending migrations")

	out = requireOK(t, "migrate", "down", "--database-url", url)
	require.Contains(t, out, "OK    down "+files[n-1])
	out = requireOK(t, "migrate", "status", "--database-url", url)
	require.Contains(t, out, "1 pending")

	requireOK(t, "migrate", "up", "--database-url", url)
	out = requireOK(t, "migrate", "status", "--database-url", url)
	require.Contains(t, out, "0 pending")
}

// TestMissingSchemaHint checks that a command on an unmigrated database says how to fix it.
func TestMissingSchemaHint(t *testing.T) {
	t.Parallel()
	url := dbtest.NewEmptyDatabase(t)
	r := leasectl(t, "stats", "--database-url", url)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "leasectl migrate up")
}
