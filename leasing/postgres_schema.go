package leasing

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leasestore/leasestore/db"
	"github.com/leasestore/leasestore/gen"
)

// ErrSchema is matched (errors.Is) by every *SchemaError.
var ErrSchema = errors.New("leasing: database schema is not what this version needs")

// SchemaError says what a database lacks of the schema this version of the
// code needs (db.Requirements: every embedded migration, and the indexes
// they create on the checked queues' tables). A database migrated further
// than the code knows meets the requirements. errors.Is(err, ErrSchema)
// holds. Nothing is changed by the check.
type SchemaError struct {
	// Migrations names each required migration the database's history
	// (db.VersionTable) does not record as applied, e.g.
	// "00005_lease_expiry_idx", ascending; every migration when the history
	// table is missing (see NoHistory).
	Migrations []string
	// NoHistory is true when db.VersionTable does not exist: the database
	// was never migrated, or was migrated by a version that kept the
	// history in goose_db_version (db.MoveLegacyHistory; leasectl migrate
	// up moves it).
	NoHistory bool
	// MissingIndexes names each required index that does not exist.
	MissingIndexes []string
	// InvalidIndexes names each required index that exists but queries
	// cannot use (pg_index.indisvalid or indisready false): what an
	// interrupted CREATE INDEX CONCURRENTLY leaves. REINDEX INDEX
	// CONCURRENTLY repairs it.
	InvalidIndexes []string
}

// Error implements error: everything missing, and what to run.
func (e *SchemaError) Error() string {
	if e.NoHistory && len(e.InvalidIndexes) == 0 {
		// Never migrated (or by an older version): the full lists say
		// nothing more than that.
		return fmt.Sprintf("leasing: the database was never migrated (no %s table, or an older version's history): "+
			"run leasectl migrate up (or db.MigrateUp)", db.VersionTable)
	}
	var parts []string
	if e.NoHistory {
		parts = append(parts, fmt.Sprintf("no migration history (%s does not exist)", db.VersionTable))
	}
	if len(e.Migrations) > 0 {
		parts = append(parts, "migrations not applied: "+strings.Join(e.Migrations, ", "))
	}
	if len(e.MissingIndexes) > 0 {
		parts = append(parts, "indexes missing: "+strings.Join(e.MissingIndexes, ", "))
	}
	if len(e.InvalidIndexes) > 0 {
		parts = append(parts, "indexes invalid (run REINDEX INDEX CONCURRENTLY on each): "+strings.Join(e.InvalidIndexes, ", "))
	}
	return "leasing: the database schema is behind this version: " + strings.Join(parts, "; ") +
		"; run leasectl migrate up (or db.MigrateUp)"
}

// Is reports whether target is ErrSchema.
func (e *SchemaError) Is(target error) bool { return target == ErrSchema }

// Querier is what CheckSchema reads through: a *pgxpool.Pool, a *pgx.Conn
// or a pgx.Tx.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, rows pgx.CopyFromSource) (int64, error)
}

// CheckSchema checks that the database on dbtx holds what the code needs
// for queues qs (both when none are given): every migration of
// db.Requirements applied, as db.VersionTable records it, and every index
// they create on the queues' tables present and valid. It reads the
// catalog and the history only: three statements, no locks beyond those
// of a read. A role that may not read the history (db/roles.sql grants
// leasestore_processor none) gets the index check alone.
//
// Errors: a *SchemaError (errors.Is ErrSchema) naming what is missing; an
// *ArgumentError for an unknown queue; else the driver error.
func CheckSchema(ctx context.Context, dbtx Querier, qs ...Queue) error {
	if len(qs) == 0 {
		qs = []Queue{Inbox, Outbox}
	}
	tables := map[string]bool{}
	for _, q := range qs {
		if _, err := ParseQueue(string(q)); err != nil {
			return err
		}
		tables[q.Table()] = true
		tables[q.KeyTable()] = true
	}
	reqs, err := db.Requirements()
	if err != nil {
		return err
	}
	g := gen.New()
	var e SchemaError
	applied := []int64{}
	history, err := g.DiagnosticsRelationAccess(ctx, dbtx, gen.DiagnosticsRelationAccessParams{RelationName: db.VersionTable})
	if err != nil {
		return fmt.Errorf("leasing: check schema: %w", err)
	}
	e.NoHistory = !history.Present
	if history.Readable {
		if applied, err = g.DiagnosticsAppliedMigrations(ctx, dbtx); err != nil {
			return fmt.Errorf("leasing: check schema: %w", err)
		}
	}
	names := []string{}
	for _, r := range reqs {
		if (history.Readable || e.NoHistory) && !slices.Contains(applied, r.Version) {
			e.Migrations = append(e.Migrations, r.Name)
		}
		for _, ix := range r.Indexes {
			if tables[ix.Table] {
				names = append(names, ix.Name)
			}
		}
	}
	states, err := g.DiagnosticsIndexStates(ctx, dbtx, gen.DiagnosticsIndexStatesParams{IndexNames: names})
	if err != nil {
		return fmt.Errorf("leasing: check schema: %w", err)
	}
	for _, st := range states {
		switch {
		case !st.Present:
			e.MissingIndexes = append(e.MissingIndexes, st.IndexName)
		case !st.Valid:
			e.InvalidIndexes = append(e.InvalidIndexes, st.IndexName)
		}
	}
	if e.NoHistory || len(e.Migrations)+len(e.MissingIndexes)+len(e.InvalidIndexes) > 0 {
		return &e
	}
	return nil
}
