// Package db holds the leasestore schema: goose migrations embedded from
// db/migrations (also sqlc's schema) and the queries sqlc compiles into gen/.
//
// db/queries/inbox.sql and outbox.sql are rendered from queue.sql.tmpl by
// db/render (make generate); edit the template, never the rendered files.
// Every time decision in the queries uses the database clock,
// statement_timestamp() (or clock_timestamp() per inserted row);
// sqlc.narg('now') pins that clock for tests and is NULL in production.
package db

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
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

// NewMigrator returns a goose provider that applies the embedded migrations
// through pool. Close the returned *sql.DB when done; it does not close pool.
//
// Errors: the goose provider error when the migration files are malformed.
func NewMigrator(pool *pgxpool.Pool) (*goose.Provider, *sql.DB, error) {
	sqlDB := stdlib.OpenDBFromPool(pool)
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, Migrations())
	if err != nil {
		_ = sqlDB.Close()
		return nil, nil, fmt.Errorf("db: goose provider: %w", err)
	}
	return provider, sqlDB, nil
}

// MigrateUp applies every pending migration through pool and returns the
// versions applied, oldest first (empty when the schema was current).
//
// Errors: the first failing migration's error, wrapped; migrations applied
// before it stay applied.
func MigrateUp(ctx context.Context, pool *pgxpool.Pool) ([]int64, error) {
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
