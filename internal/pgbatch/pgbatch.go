// Package pgbatch runs sqlc-generated statements in one pgx.Batch. A
// generated method runs its statement on a gen.DBTX and reads the result at
// once, so Send calls each step twice: on a Recorder, which queues the
// statement and runs nothing, then, once the batch was sent, on a Replayer,
// which hands it the next result. The SQL stays the generated text with
// bound parameters. leasing's send and internal/explain use it.
package pgbatch

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leasestore/leasestore/gen"
)

// ErrCaptured is what a Recorder returns instead of running a statement.
var ErrCaptured = errors.New("pgbatch: statement captured, not run")

// Recorder is a gen.DBTX that queues each statement it is given in Batch
// and runs nothing: Query, Exec and QueryRow's Scan return ErrCaptured,
// CopyFrom an error (COPY cannot be batched).
type Recorder struct {
	Batch pgx.Batch
}

var _ gen.DBTX = (*Recorder)(nil)

// Exec queues sql with args.
func (r *Recorder) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	r.Batch.Queue(sql, args...)
	return pgconn.CommandTag{}, ErrCaptured
}

// Query queues sql with args.
func (r *Recorder) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	r.Batch.Queue(sql, args...)
	return nil, ErrCaptured
}

// QueryRow queues sql with args; the row's Scan returns ErrCaptured.
func (r *Recorder) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	r.Batch.Queue(sql, args...)
	return errRow{}
}

// CopyFrom records nothing and fails: COPY cannot be part of a batch.
func (r *Recorder) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	return 0, errors.New("pgbatch: COPY cannot be recorded in a batch")
}

type errRow struct{}

func (errRow) Scan(...any) error { return ErrCaptured }

// Statement is one SQL text with its arguments, as a generated method sends it.
type Statement struct {
	SQL  string
	Args []any
}

// First returns the first statement recorded, or false when none was.
func (r *Recorder) First() (Statement, bool) {
	if r.Batch.Len() == 0 {
		return Statement{}, false
	}
	q := r.Batch.QueuedQueries[0]
	return Statement{SQL: q.SQL, Args: q.Arguments}, true
}

// Replayer is a gen.DBTX that answers each call with the next result of a
// sent batch, ignoring the SQL it is given (the same the recording pass
// queued, in the same order).
type Replayer struct {
	Results pgx.BatchResults
}

var _ gen.DBTX = Replayer{}

// Exec returns the next result as a command tag.
func (r Replayer) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return r.Results.Exec()
}

// Query returns the next result's rows.
func (r Replayer) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return r.Results.Query()
}

// QueryRow returns the next result's row.
func (r Replayer) QueryRow(context.Context, string, ...any) pgx.Row {
	return r.Results.QueryRow()
}

// CopyFrom fails: COPY cannot be part of a batch.
func (r Replayer) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	return 0, errors.New("pgbatch: COPY cannot be replayed from a batch")
}

// Sender sends a batch: a pool (one implicit transaction), a connection or
// an open transaction.
type Sender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Send runs steps, each one generated statement on the gen.DBTX it is
// given, in one batch on db, and returns the first error: a step's or the
// batch's.
func Send(ctx context.Context, db Sender, steps ...func(gen.DBTX) error) error {
	var rec Recorder
	for _, step := range steps {
		if err := step(&rec); !errors.Is(err, ErrCaptured) {
			return fmt.Errorf("pgbatch: record step: %v", err)
		}
	}
	if rec.Batch.Len() != len(steps) {
		return fmt.Errorf("pgbatch: recorded %d statements for %d steps", rec.Batch.Len(), len(steps))
	}
	results := db.SendBatch(ctx, &rec.Batch)
	var first error
	for _, step := range steps {
		if first = step(Replayer{Results: results}); first != nil {
			break
		}
	}
	if err := results.Close(); first == nil {
		first = err
	}
	return first
}
