package doctor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/db"
	"github.com/leasestore/leasestore/gen"
	"github.com/leasestore/leasestore/leasing"
)

// RequiredIndexes returns the indexes queue q's statements rely on: those
// the embedded migrations create on its table (db.Requirements, the list
// leasing.CheckSchema checks too), in migration order.
//
// Errors: those of db.Requirements.
func RequiredIndexes(q leasing.Queue) ([]string, error) {
	reqs, err := db.Requirements()
	if err != nil {
		return nil, err
	}
	var idx []string
	for _, r := range reqs {
		for _, ix := range r.Indexes {
			if ix.Table == q.Table() {
				idx = append(idx, ix.Name)
			}
		}
	}
	return idx, nil
}

// checkMigrations fills rep's migrations from leasing.CheckSchema, the
// check every leasing.Postgres runs before its first claim, and reports each
// migration not applied as a problem (the indexes are checked per queue).
func checkMigrations(ctx context.Context, pool *pgxpool.Pool, opts Options, rep *Report) error {
	n := notes{&rep.Problems, &rep.Warnings}
	reqs, err := db.Requirements()
	if err != nil {
		return fmt.Errorf("doctor: %w", err)
	}
	var schemaErr *leasing.SchemaError
	err = leasing.CheckSchema(ctx, pool, opts.Queues...)
	if err != nil && !errors.As(err, &schemaErr) {
		return fmt.Errorf("doctor: %w", err)
	}
	var missing []string
	if schemaErr != nil {
		missing = schemaErr.Migrations
	}
	rep.MigrationHistory = schemaErr == nil || !schemaErr.NoHistory
	readable, err := gen.New().DiagnosticsRelationAccess(ctx, pool, gen.DiagnosticsRelationAccessParams{RelationName: db.VersionTable})
	if err != nil {
		return fmt.Errorf("doctor: %w", err)
	}
	if rep.MigrationHistory && !readable.Readable {
		n.warn(msgHistoryUnreadable, db.VersionTable)
		return nil
	}
	for _, r := range reqs {
		rep.Migrations = append(rep.Migrations, MigrationState{Name: r.Name, Applied: !slices.Contains(missing, r.Name)})
	}
	if !rep.MigrationHistory {
		n.problem(msgHistoryMissing, db.VersionTable)
	} else if len(missing) > 0 {
		n.problem(msgMigrationsMissing, strings.Join(missing, ", "))
	}
	return nil
}

// checkIndexes fills qr's indexes with the state of each index q needs
// (RequiredIndexes) and reports each one missing or invalid.
func checkIndexes(ctx context.Context, pool *pgxpool.Pool, q leasing.Queue, qr *QueueReport, n notes) error {
	indexes, err := gen.New().DiagnosticsIndexes(ctx, pool, gen.DiagnosticsIndexesParams{TableName: q.Table()})
	if err != nil {
		return fmt.Errorf("doctor: %s indexes: %w", q.Table(), err)
	}
	required, err := RequiredIndexes(q)
	if err != nil {
		return fmt.Errorf("doctor: %w", err)
	}
	for _, name := range required {
		st := IndexState{Name: name}
		for _, ix := range indexes {
			if ix.IndexName == name {
				st.Present, st.Valid = true, ix.Valid && ix.Ready
			}
		}
		qr.Indexes = append(qr.Indexes, st)
		switch {
		case !st.Present:
			n.problem(msgIndexMissing, name)
		case !st.Valid:
			n.problem(msgIndexInvalid, name)
		}
	}
	return nil
}
