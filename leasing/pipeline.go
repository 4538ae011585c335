package leasing

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leasestore/leasestore/gen"
)

// A pipeline sends several generated statements in one round trip. The
// generated query methods run a statement on a gen.DBTX and read its result
// at once, so a pipeline calls each step twice: first on a recordDB, which
// queues the statement and its arguments in a pgx.Batch and runs nothing,
// then, after the batch was sent, on a replayDB, which hands each step the
// next statement's result. The SQL stays the sqlc-generated text with bound
// parameters; nothing is built from strings.
//
// pgx sends a batch outside a transaction as one implicit transaction: the
// statements commit together, once, or not at all.

// errCaptured is what recordDB returns instead of running a statement.
var errCaptured = errors.New("leasing: statement captured, not run")

// recordDB is a gen.DBTX that queues each statement it is given in batch
// and runs nothing: Query, Exec and QueryRow return errCaptured.
type recordDB struct {
	batch pgx.Batch
}

var _ gen.DBTX = (*recordDB)(nil)

func (r *recordDB) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	r.batch.Queue(sql, args...)
	return pgconn.CommandTag{}, errCaptured
}

func (r *recordDB) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	r.batch.Queue(sql, args...)
	return nil, errCaptured
}

func (r *recordDB) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	r.batch.Queue(sql, args...)
	return errRow{}
}

func (r *recordDB) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	return 0, errors.New("leasing: COPY cannot be recorded in a pipeline")
}

type errRow struct{}

func (errRow) Scan(...any) error { return errCaptured }

// first returns the first statement recorded, or false when none was.
func (r *recordDB) first() (statement, bool) {
	if r.batch.Len() == 0 {
		return statement{}, false
	}
	q := r.batch.QueuedQueries[0]
	return statement{sql: q.SQL, args: q.Arguments}, true
}

// replayDB is a gen.DBTX that answers each call with the next result of a
// sent batch, ignoring the SQL it is given (the same the recording pass
// queued, in the same order).
type replayDB struct {
	results pgx.BatchResults
}

var _ gen.DBTX = replayDB{}

func (r replayDB) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return r.results.Exec()
}

func (r replayDB) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return r.results.Query()
}

func (r replayDB) QueryRow(context.Context, string, ...any) pgx.Row {
	return r.results.QueryRow()
}

func (r replayDB) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	return 0, errors.New("leasing: COPY cannot be replayed from a pipeline")
}

// pipeline runs steps, each one generated statement on the gen.DBTX it is
// given, in one round trip and one implicit transaction on s's pool, after
// UseGenericPlans: pgx prepares each statement once per connection, and the
// generic plan is then reused (the claim's and the fenced writes' generic
// plans are their custom index plans; integration/plan_test.go checks both).
// Planning the claim for every call costs more than running it at small
// batches. It returns the first error: a step's, or the batch's. When
// the server failed a statement, no statement took effect; when reading a
// result failed on the client (context ended, connection lost, decode
// error), the batch may have committed.
func (s *Postgres) pipeline(ctx context.Context, steps ...func(gen.DBTX) error) error {
	generic := func(db gen.DBTX) error { return gen.New().UseGenericPlans(ctx, db) }
	steps = append([]func(gen.DBTX) error{generic}, steps...)
	var rec recordDB
	for _, step := range steps {
		if err := step(&rec); !errors.Is(err, errCaptured) {
			return fmt.Errorf("leasing: record pipeline step: %v", err)
		}
	}
	if rec.batch.Len() != len(steps) {
		return fmt.Errorf("leasing: pipeline recorded %d statements for %d steps", rec.batch.Len(), len(steps))
	}
	results := s.pool.SendBatch(ctx, &rec.batch)
	var first error
	for _, step := range steps {
		if err := step(replayDB{results}); err != nil {
			first = err
			break
		}
	}
	if err := results.Close(); first == nil {
		first = err
	}
	return first
}
