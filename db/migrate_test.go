package db_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/db"
	"github.com/leasestore/leasestore/internal/dbtest"
)

func TestMigrate(t *testing.T) {
	t.Parallel()

	ctx := t.Context()
	pool, err := pgxpool.New(ctx, dbtest.NewEmptyDatabase(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	provider, sqlDB, err := db.NewMigrator(pool)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sqlDB.Close() })
	sources := provider.ListSources()
	latest := sources[len(sources)-1].Version

	_, err = provider.Up(ctx)
	require.NoError(t, err)
	requireSchema(t, pool)
	requireNoRelation(t, pool, db.LegacyVersionTable)

	_, err = provider.DownTo(ctx, 0)
	require.NoError(t, err)
	rows, err := pool.Query(ctx, `
		SELECT c.relname FROM pg_class AS c
		JOIN pg_namespace AS n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public' AND c.relname NOT LIKE 'leasestore_db_version%'
		UNION ALL
		SELECT p.proname FROM pg_proc AS p
		JOIN pg_namespace AS n ON n.oid = p.pronamespace
		WHERE n.nspname = 'public'`)
	require.NoError(t, err)
	leftovers, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, leftovers, "relations and functions left after down to 0")

	for {
		_, err := provider.UpByOne(ctx)
		if errors.Is(err, goose.ErrNoNextVersion) {
			break
		}
		require.NoError(t, err)
	}
	version, err := provider.GetDBVersion(ctx)
	require.NoError(t, err)
	require.Equal(t, latest, version)
	requireSchema(t, pool)

	t.Run("Insert/DefaultsArePendingAndDue", func(t *testing.T) {
		for _, table := range []string{"inbox_messages", "outbox_messages"} {
			var id string
			err := pool.QueryRow(ctx, "INSERT INTO "+pgx.Identifier{table}.Sanitize()+
				` (message_id, payload) VALUES (gen_random_uuid(), '\x01') RETURNING message_id::text`).Scan(&id)
			require.NoError(t, err, table)

			// A later statement, so that now() is past the insert's clock_timestamp().
			var status string
			var due, leased bool
			var generation, attempts int64
			err = pool.QueryRow(ctx, "SELECT status, visible_after <= now(), lease_owner IS NOT NULL OR lease_expires_at IS NOT NULL, "+
				"lease_generation, attempt_count FROM "+pgx.Identifier{table}.Sanitize()+" WHERE message_id = $1::uuid", id).
				Scan(&status, &due, &leased, &generation, &attempts)
			require.NoError(t, err, table)
			require.Equal(t, "pending", status, table)
			require.True(t, due, table)
			require.False(t, leased, table)
			require.Positive(t, generation, "%s: generations start at the enqueueing transaction's id", table)
			require.Zero(t, attempts, table)
		}
	})

	t.Run("Insert/InFlightWithoutLeaseIsRejected", func(t *testing.T) {
		for table, inFlight := range map[string]string{"inbox_messages": "processing", "outbox_messages": "publishing"} {
			_, err := pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{table}.Sanitize()+
				` (message_id, payload, status) VALUES (gen_random_uuid(), '\x01', $1)`, inFlight)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr, table)
			require.Equal(t, "23514", pgErr.Code, table) // check_violation
			require.Equal(t, table+"_lease_check", pgErr.ConstraintName)
		}
	})
}

// requireSchema asserts that the claim and idempotency indexes exist and
// that every index on the two tables is valid and ready.
func requireSchema(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	type index struct {
		Name  string
		Valid bool
		Ready bool
	}
	rows, err := pool.Query(t.Context(), `
		SELECT c.relname, i.indisvalid, i.indisready
		FROM pg_index AS i
		JOIN pg_class AS c ON c.oid = i.indexrelid
		WHERE i.indrelid IN ('inbox_messages'::regclass, 'outbox_messages'::regclass)
		ORDER BY c.relname`)
	require.NoError(t, err)
	indexes, err := pgx.CollectRows(rows, pgx.RowToStructByPos[index])
	require.NoError(t, err)

	names := make([]string, 0, len(indexes))
	for _, ix := range indexes {
		require.True(t, ix.Valid && ix.Ready, "index %s is not valid", ix.Name)
		names = append(names, ix.Name)
	}
	require.Subset(t, names, []string{
		"inbox_messages_ready_idx",
		"inbox_messages_inflight_idx",
		"inbox_messages_idempotency_key_idx",
		"outbox_messages_ready_idx",
		"outbox_messages_inflight_idx",
		"inbox_messages_tenant_ready_idx",
		"inbox_messages_tenant_inflight_idx",
		"outbox_messages_tenant_ready_idx",
		"outbox_messages_tenant_inflight_idx",
		"inbox_messages_expiry_idx",
		"outbox_messages_expiry_idx",
		"inbox_messages_completed_idx",
		"inbox_messages_dead_lettered_idx",
		"outbox_messages_published_idx",
		"outbox_messages_dead_lettered_idx",
	})
}

// requireNoRelation asserts that relation name does not exist.
func requireNoRelation(t *testing.T, pool *pgxpool.Pool, name string) {
	t.Helper()
	var exists bool
	require.NoError(t, pool.QueryRow(t.Context(), "SELECT to_regclass($1) IS NOT NULL", name).Scan(&exists))
	require.False(t, exists, "%s exists", name)
}

// appMigrations are an application's own goose migrations, versions as
// given, each creating table app_<version>.
func appMigrations(versions ...int64) fstest.MapFS {
	fsys := fstest.MapFS{}
	for _, v := range versions {
		fsys[fmt.Sprintf("%05d_app.sql", v)] = &fstest.MapFile{
			Data: fmt.Appendf(nil, "-- +goose Up\nCREATE TABLE app_%d (id int);\n-- +goose Down\nDROP TABLE app_%d;\n", v, v),
		}
	}
	return fsys
}

// appProvider is the application's goose provider on pool: goose's default
// version table, goose_db_version.
func appProvider(t *testing.T, pool *pgxpool.Pool, fsys fstest.MapFS) *goose.Provider {
	t.Helper()
	sqlDB := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = sqlDB.Close() })
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, fsys)
	require.NoError(t, err)
	return p
}

// versionRows returns the (version_id, is_applied) rows of goose version
// table table in insertion order, "v" for applied and "-v" for a rollback.
func versionRows(t *testing.T, pool *pgxpool.Pool, table string) []int64 {
	t.Helper()
	rows, err := pool.Query(t.Context(), "SELECT CASE WHEN is_applied THEN version_id ELSE -version_id END FROM "+
		pgx.Identifier{table}.Sanitize()+" ORDER BY id")
	require.NoError(t, err)
	vs, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return vs
}

// ourVersions are the embedded migrations' versions.
func ourVersions(t *testing.T) []int64 {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), "postgres://unused")
	require.NoError(t, err)
	defer pool.Close()
	provider, sqlDB, err := db.NewMigrator(pool)
	require.NoError(t, err)
	defer sqlDB.Close()
	var vs []int64
	for _, s := range provider.ListSources() {
		vs = append(vs, s.Version)
	}
	return vs
}

func appResults(rs []*goose.MigrationResult) []int64 {
	vs := []int64{}
	for _, r := range rs {
		vs = append(vs, r.Source.Version)
	}
	return vs
}

// TestMigrateBesideApplicationHistory runs our migrations and an
// application's own goose migrations, versions 1-3 like ours, on one
// database in both orders: neither sees the other's history.
func TestMigrateBesideApplicationHistory(t *testing.T) {
	t.Parallel()
	ours := ourVersions(t)
	withZero := append([]int64{0}, ours...)

	t.Run("ApplicationFirst", func(t *testing.T) {
		t.Parallel()
		pool := newPool(t, dbtest.NewEmptyDatabase(t), "", 4)
		app := appProvider(t, pool, appMigrations(1, 2, 3))
		rs, err := app.Up(t.Context())
		require.NoError(t, err)
		require.Equal(t, []int64{1, 2, 3}, appResults(rs))

		applied, err := db.MigrateUp(t.Context(), pool)
		require.NoError(t, err)
		require.Equal(t, ours, applied)
		requireSchema(t, pool)
		require.Equal(t, []int64{0, 1, 2, 3}, versionRows(t, pool, db.LegacyVersionTable), "the application's history")
		require.Equal(t, withZero, versionRows(t, pool, db.VersionTable))

		// The application's next migration is its version 4, which is also one of ours.
		app = appProvider(t, pool, appMigrations(1, 2, 3, 4))
		rs, err = app.Up(t.Context())
		require.NoError(t, err)
		require.Equal(t, []int64{4}, appResults(rs))
	})

	t.Run("OursFirst", func(t *testing.T) {
		t.Parallel()
		pool := newPool(t, dbtest.NewEmptyDatabase(t), "", 4)
		applied, err := db.MigrateUp(t.Context(), pool)
		require.NoError(t, err)
		require.Equal(t, ours, applied)
		requireNoRelation(t, pool, db.LegacyVersionTable)

		app := appProvider(t, pool, appMigrations(1, 2, 3))
		rs, err := app.Up(t.Context())
		require.NoError(t, err)
		require.Equal(t, []int64{1, 2, 3}, appResults(rs), "none of the application's versions is taken for ours")
		require.Equal(t, []int64{0, 1, 2, 3}, versionRows(t, pool, db.LegacyVersionTable))
		require.Equal(t, withZero, versionRows(t, pool, db.VersionTable))

		applied, err = db.MigrateUp(t.Context(), pool)
		require.NoError(t, err)
		require.Empty(t, applied)
		requireSchema(t, pool)
	})

	t.Run("ApplicationFirstThenOldMigrateUpFailed", func(t *testing.T) {
		// Before the version table of our own: the old MigrateUp took the
		// application's 1-3 for ours and failed at 4. Nothing of ours is in
		// goose_db_version, so nothing moves.
		t.Parallel()
		pool := newPool(t, dbtest.NewEmptyDatabase(t), "", 4)
		app := appProvider(t, pool, appMigrations(1, 2, 3))
		_, err := app.Up(t.Context())
		require.NoError(t, err)
		_, err = legacyProvider(t, pool).Up(t.Context())
		require.ErrorContains(t, err, "inbox_messages")

		applied, err := db.MigrateUp(t.Context(), pool)
		require.NoError(t, err)
		require.Equal(t, ours, applied)
		requireSchema(t, pool)
		require.Equal(t, []int64{0, 1, 2, 3}, versionRows(t, pool, db.LegacyVersionTable))
	})
}

// legacyProvider is how MigrateUp migrated before the version table of our
// own: goose's default table, goose_db_version.
func legacyProvider(t *testing.T, pool *pgxpool.Pool) *goose.Provider {
	t.Helper()
	sqlDB := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { _ = sqlDB.Close() })
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, db.Migrations())
	require.NoError(t, err)
	return p
}

// TestMigrateConcurrent runs five MigrateUp at once, each on a pool of its
// own, on an empty database: each migration is applied once.
func TestMigrateConcurrent(t *testing.T) {
	t.Parallel()
	url := dbtest.NewEmptyDatabase(t)
	const migrators = 5
	results := make([][]int64, migrators)
	errs := make([]error, migrators)
	pools := make([]*pgxpool.Pool, migrators)
	for i := range pools {
		pools[i] = newPool(t, url, "leasestore-migrator", 4)
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range migrators {
		wg.Go(func() {
			<-start
			results[i], errs[i] = db.MigrateUp(t.Context(), pools[i])
		})
	}
	close(start)
	wg.Wait()
	var all []int64
	for i := range migrators {
		require.NoError(t, errs[i], "migrator %d", i)
		all = append(all, results[i]...)
	}
	require.ElementsMatch(t, ourVersions(t), all, "every version applied by exactly one migrator")
	requireSchema(t, pools[0])
	require.Equal(t, append([]int64{0}, ourVersions(t)...), versionRows(t, pools[0], db.VersionTable))
}

// TestMigrateLegacyUpgrade upgrades a database migrated the old way (our
// history in goose_db_version, beside an application's versions) with rows
// in both queue tables: the history moves to leasestore_db_version, the
// application's stays, no row is lost, and five concurrent upgraders move
// it once.
func TestMigrateLegacyUpgrade(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := dbtest.NewEmptyDatabase(t)
	pool := newPool(t, url, "", 4)
	_, err := legacyProvider(t, pool).Up(ctx)
	require.NoError(t, err)
	appVersions := []int64{20240101000001, 20240101000002, 20240101000003}
	app := appProvider(t, pool, appMigrations(appVersions...))
	_, err = app.Up(ctx)
	require.NoError(t, err)
	for _, stmt := range []string{
		`INSERT INTO inbox_messages (message_id, payload) SELECT gen_random_uuid(), '\x01' FROM generate_series(1, 100)`,
		`INSERT INTO outbox_messages (message_id, payload, topic) SELECT gen_random_uuid(), '\x02', 't' FROM generate_series(1, 50)`,
	} {
		_, err := pool.Exec(ctx, stmt)
		require.NoError(t, err)
	}
	before := tableDigest(t, pool)
	legacy := versionRows(t, pool, db.LegacyVersionTable)
	ours := ourVersions(t)
	require.Equal(t, append(append([]int64{0}, ours...), appVersions...), legacy)

	const upgraders = 5
	errs := make([]error, upgraders)
	applied := make([][]int64, upgraders)
	var wg sync.WaitGroup
	for i := range upgraders {
		p := newPool(t, url, "leasestore-upgrader", 2)
		wg.Go(func() { applied[i], errs[i] = db.MigrateUp(ctx, p) })
	}
	wg.Wait()
	for i := range upgraders {
		require.NoError(t, errs[i], "upgrader %d", i)
		require.Empty(t, applied[i], "upgrader %d applied migrations again", i)
	}
	require.Equal(t, before, tableDigest(t, pool), "rows changed")
	require.Equal(t, append([]int64{0}, ours...), versionRows(t, pool, db.VersionTable))
	require.Equal(t, append([]int64{0}, appVersions...), versionRows(t, pool, db.LegacyVersionTable), "the application's history")
	requireSchema(t, pool)

	rs, err := app.Up(ctx)
	require.NoError(t, err)
	require.Empty(t, rs, "the application's history is whole")
	moved, err := db.MoveLegacyHistory(ctx, pool)
	require.NoError(t, err)
	require.Empty(t, moved, "moves once")
}

// TestMigrateGooseCLI applies the migration files with the goose CLI, at
// the version go.mod requires, and -table leasestore_db_version: the schema
// is complete and MigrateUp finds nothing pending.
func TestMigrateGooseCLI(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Version}}", "github.com/pressly/goose/v3").Output()
	require.NoError(t, err)
	version := strings.TrimSpace(string(out))
	bin := t.TempDir()
	build := exec.CommandContext(ctx, "go", "install",
		"-tags", "no_clickhouse no_libsql no_mssql no_azuresql no_mysql no_sqlite3 no_vertica no_ydb",
		"github.com/pressly/goose/v3/cmd/goose@"+version)
	build.Env = append(os.Environ(), "GOBIN="+bin, "GOFLAGS=-mod=mod")
	build.Dir = bin // outside this module
	if out, err := build.CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("build the goose CLI %s: %v\n%s", version, err, out)
		}
		t.Skipf("cannot build the goose CLI %s here (%v): %s", version, err, out)
	}
	url := dbtest.NewEmptyDatabase(t)
	dir, err := filepath.Abs("../db/migrations")
	require.NoError(t, err)
	goose := func(args ...string) string {
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "goose"),
			append([]string{"-dir", dir, "-table", db.VersionTable, "postgres", url}, args...)...)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "goose %s:\n%s", strings.Join(args, " "), out)
		return string(out)
	}
	goose("up")
	out2 := goose("status")
	require.Equal(t, len(ourVersions(t)), strings.Count(out2, ".sql"), out2)

	pool := newPool(t, url, "", 2)
	requireSchema(t, pool)
	requireNoRelation(t, pool, db.LegacyVersionTable)
	applied, err := db.MigrateUp(ctx, pool)
	require.NoError(t, err)
	require.Empty(t, applied)
}
