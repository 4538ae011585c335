// Package db holds the leasestore schema: goose migrations embedded from
// db/migrations (also sqlc's schema) and the queries sqlc compiles into gen/.
//
// The per-queue files db/queries/inbox_<concern>.sql and
// outbox_<concern>.sql are rendered from <concern>.sql.tmpl by db/render
// (make generate); edit the template, never the rendered files.
// Every time decision in the queries uses the database clock,
// statement_timestamp() (or clock_timestamp() per inserted row);
// sqlc.narg('now') pins that clock for tests and is NULL in production.
//
// # Migrations beside the application's
//
// The migrations record their history in a goose version table of their
// own, VersionTable (leasestore_db_version), never in goose's default
// goose_db_version, so they run before or after an application's own goose
// migrations without reading or writing its history. Run them with
// MigrateUp, with a provider from NewProvider or NewMigrator in the
// application's own migration step, or with the goose CLI on the files of
// Migrations (or db/migrations) and -table leasestore_db_version.
//
// Concurrent runs serialise on a PostgreSQL session advisory lock,
// MigrationLockID, that goose's session locker takes; it is not goose's
// default lock id, so an application's goose run that runs ours inside it
// does not wait for itself.
//
// Databases migrated before the migrations had their own table hold our
// history in goose_db_version. MoveLegacyHistory, which MigrateUp runs
// first, moves it; see there for how it tells our rows from the
// application's.
package db

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"slices"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"
)

// VersionTable is the goose version table of the leasestore migrations, in
// the search path's first schema (public by default). Pass it to the goose
// CLI as -table.
const VersionTable = "leasestore_db_version"

// LegacyVersionTable is goose's default version table, where versions
// before VersionTable existed recorded the leasestore history, mixed with
// the application's own.
const LegacyVersionTable = "goose_db_version"

// MigrationLockID is the key of the PostgreSQL session advisory lock
// (pg_try_advisory_lock(bigint)) that serialises leasestore migration runs
// on one database. It differs from goose's default lock id.
const MigrationLockID int64 = 0x6c73_6d69_6772 // "lsmigr"

// lockPoll is how often, in seconds, a migration run tries the lock again;
// lockPolls how many times before it gives up (15 minutes).
const (
	lockPoll  = 1
	lockPolls = 900
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrations returns the embedded goose migration files, named
// NNNNN_description.sql at the root of the returned file system.
func Migrations() fs.FS {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		panic(err) // the directory is embedded at build time
	}
	return sub
}

// NewProvider returns a goose provider of the embedded migrations on sqlDB
// (a PostgreSQL database/sql handle, for example stdlib.OpenDBFromPool)
// that records them in VersionTable and holds MigrationLockID while it
// migrates. opts are further goose options, for example goose.WithVerbose;
// they must not set the table name, the store or a locker.
//
// Errors: the goose provider error when the migration files are malformed
// or opts conflict.
func NewProvider(sqlDB *sql.DB, opts ...goose.ProviderOption) (*goose.Provider, error) {
	locker, err := newLocker()
	if err != nil {
		return nil, err
	}
	all := append([]goose.ProviderOption{
		goose.WithTableName(VersionTable),
		goose.WithSessionLocker(locker),
	}, opts...)
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, Migrations(), all...)
	if err != nil {
		return nil, fmt.Errorf("db: goose provider: %w", err)
	}
	return provider, nil
}

func newLocker() (lock.SessionLocker, error) {
	locker, err := lock.NewPostgresSessionLocker(
		lock.WithLockID(MigrationLockID),
		lock.WithLockTimeout(lockPoll, lockPolls),
	)
	if err != nil {
		return nil, fmt.Errorf("db: migration lock: %w", err)
	}
	return locker, nil
}

// NewMigrator returns NewProvider's provider over pool. Close the returned
// *sql.DB when done; it does not close pool.
//
// Errors: the goose provider error when the migration files are malformed.
func NewMigrator(pool *pgxpool.Pool) (*goose.Provider, *sql.DB, error) {
	sqlDB := stdlib.OpenDBFromPool(pool)
	provider, err := NewProvider(sqlDB)
	if err != nil {
		_ = sqlDB.Close()
		return nil, nil, err
	}
	return provider, sqlDB, nil
}

// MigrateUp moves a legacy history (MoveLegacyHistory), then applies every
// pending migration through pool and returns the versions applied, oldest
// first (empty when the schema was current). Concurrent calls, also from
// other processes, run one after the other.
//
// Errors: the first failing migration's error, wrapped; migrations applied
// before it stay applied.
func MigrateUp(ctx context.Context, pool *pgxpool.Pool) ([]int64, error) {
	if _, err := MoveLegacyHistory(ctx, pool); err != nil {
		return nil, err
	}
	provider, sqlDB, err := NewMigrator(pool)
	if err != nil {
		return nil, err
	}
	defer sqlDB.Close()
	results, err := provider.Up(ctx)
	versions := make([]int64, 0, len(results))
	for _, r := range results {
		versions = append(versions, r.Source.Version)
	}
	if err != nil {
		return versions, fmt.Errorf("db: migrate up: %w", err)
	}
	return versions, nil
}

// MoveLegacyHistory moves the leasestore history that versions before
// VersionTable wrote to goose_db_version into VersionTable, in one
// transaction under MigrationLockID, and returns the versions moved
// (empty when there was nothing to move).
//
// The rule that tells our rows from the application's: it moves only when
// VersionTable does not exist yet, both queue tables (inbox_messages,
// outbox_messages) exist, and goose_db_version records our first version
// as applied; it then moves the rows whose version_id is one of our
// migrations' versions (1..5 today), with their applied flags and times,
// and leaves every other row, the application's, where it is. A database
// where the application's own versions 1..3 came first never held our
// tables (the old MigrateUp failed at our version 4), so nothing moves
// there.
//
// An application that runs the migrations through NewProvider or the goose
// CLI on a database migrated the old way calls this (or runs leasectl
// migrate up) once first.
//
// Errors: the server's; nothing moved then.
func MoveLegacyHistory(ctx context.Context, pool *pgxpool.Pool) ([]int64, error) {
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	versions, err := ourVersions()
	if err != nil {
		return nil, err
	}
	locker, err := newLocker()
	if err != nil {
		return nil, err
	}
	conn, err := sqlDB.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("db: move legacy history: %w", err)
	}
	defer conn.Close()
	if err := locker.SessionLock(ctx, conn); err != nil {
		return nil, fmt.Errorf("db: move legacy history: %w", err)
	}
	moved, err := moveLegacyHistory(ctx, conn, versions)
	if uerr := locker.SessionUnlock(context.WithoutCancel(ctx), conn); uerr != nil && err == nil {
		err = uerr
	}
	if err != nil {
		return nil, fmt.Errorf("db: move legacy history: %w", err)
	}
	return moved, nil
}

// ourVersions returns the versions of the embedded migrations, ascending.
func ourVersions() ([]int64, error) {
	files, err := fs.Glob(Migrations(), "*.sql")
	if err != nil {
		return nil, err
	}
	versions := make([]int64, 0, len(files))
	for _, f := range files {
		v, err := goose.NumericComponent(f)
		if err != nil {
			return nil, fmt.Errorf("db: migration %s: %w", f, err)
		}
		versions = append(versions, v)
	}
	slices.Sort(versions)
	return versions, nil
}

// The statements of moveLegacyHistory. Table names are fixed: these are
// goose's tables, outside the sqlc schema.
const (
	legacyNeedsMove = `SELECT to_regclass('leasestore_db_version') IS NULL
		AND to_regclass('inbox_messages') IS NOT NULL
		AND to_regclass('outbox_messages') IS NOT NULL
		AND to_regclass('goose_db_version') IS NOT NULL`
	legacyFirstApplied = `SELECT coalesce((SELECT is_applied FROM goose_db_version
		WHERE version_id = $1 ORDER BY id DESC LIMIT 1), false)`
	legacyCopy = `INSERT INTO leasestore_db_version (version_id, is_applied, tstamp)
		SELECT version_id, is_applied, tstamp FROM goose_db_version
		WHERE version_id = ANY($1::bigint[]) ORDER BY id`
	legacyDelete = `DELETE FROM goose_db_version WHERE version_id = ANY($1::bigint[])
		RETURNING version_id`
)

func moveLegacyHistory(ctx context.Context, conn *sql.Conn, versions []int64) (moved []int64, err error) {
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	var needs, applied bool
	if err := tx.QueryRowContext(ctx, legacyNeedsMove).Scan(&needs); err != nil {
		return nil, err
	}
	if needs && len(versions) > 0 {
		if err := tx.QueryRowContext(ctx, legacyFirstApplied, versions[0]).Scan(&applied); err != nil {
			return nil, err
		}
	}
	if !applied {
		return nil, tx.Rollback()
	}
	// goose's own table definition and first row, as goose would create them.
	store, err := database.NewStore(database.DialectPostgres, VersionTable)
	if err != nil {
		return nil, err
	}
	if err := store.CreateVersionTable(ctx, tx); err != nil {
		return nil, err
	}
	if err := store.Insert(ctx, tx, database.InsertRequest{Version: 0}); err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, legacyCopy, versions); err != nil {
		return nil, err
	}
	rows, err := tx.QueryContext(ctx, legacyDelete, versions)
	if err != nil {
		return nil, err
	}
	seen := map[int64]bool{}
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			_ = rows.Close()
			return nil, err
		}
		if !seen[v] {
			seen[v] = true
			moved = append(moved, v)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	slices.Sort(moved)
	return moved, tx.Commit()
}
