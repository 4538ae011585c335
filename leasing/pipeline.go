package leasing

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leasestore/leasestore/gen"
	"github.com/leasestore/leasestore/internal/pgbatch"
)

// A pipeline sends several generated statements in one round trip: each
// step runs once on a pgbatch.Recorder, which queues its statement, and once
// on a pgbatch.Replayer after the batch was sent, which hands it its result.
//
// pgx sends a batch outside a transaction as one implicit transaction: the
// statements commit together, once, or not at all.
//
// Every statement the store runs in a transaction of its own goes through a
// pipeline, after a prelude local to that transaction (db/queries/plans.sql):
// UseReadCommitted first, so that the store's statements run at READ
// COMMITTED whatever default_transaction_isolation the database, role or
// session sets, then the lock timeout (PostgresOptions.LockTimeout). The
// prelude costs no extra round trip.

// pipeline runs steps, each one generated statement on the gen.DBTX it is
// given, in one round trip and one implicit transaction on s's pool, after
// UseReadCommitted and UseGenericPlansAndLockTimeout: pgx prepares each
// statement once per connection, and the generic plan is then reused (the
// claim's and the fenced writes' generic plans are their custom index
// plans; integration/plan_test.go checks both). Planning the claim for
// every call costs more than running it at small batches. It returns the
// first error: a step's, or the batch's. When the server failed a
// statement, no statement took effect; when reading a result failed on the
// client (context ended, connection lost, decode error), the batch may have
// committed.
func (s *Postgres) pipeline(ctx context.Context, steps ...func(gen.DBTX) error) error {
	return s.send(ctx, true, s.genericPlansStep(ctx), steps)
}

// genericPlansStep returns the UseGenericPlansAndLockTimeout step of s's
// lock timeout.
func (s *Postgres) genericPlansStep(ctx context.Context) func(gen.DBTX) error {
	return func(db gen.DBTX) error {
		return gen.New().UseGenericPlansAndLockTimeout(ctx, db, gen.UseGenericPlansAndLockTimeoutParams{LockTimeout: s.lockTimeout})
	}
}

// pipelineSessionPlans is pipeline for the statements whose plans are left
// to the session's plan_cache_mode: operator actions, reads and Enqueue,
// whose best plan may depend on their parameter values. It sends
// UseReadCommitted and UseLockTimeout before steps.
func (s *Postgres) pipelineSessionPlans(ctx context.Context, steps ...func(gen.DBTX) error) error {
	return s.send(ctx, true, s.lockTimeoutStep(ctx), steps)
}

// pipelineAnySchema is pipelineSessionPlans without the schema check, for
// the statements that work on a schema older than the code's: Enqueue
// (producers keep enqueuing while processors wait for a migration, as
// EnqueueTx does), Stats and the vacuum policy's VacuumState.
func (s *Postgres) pipelineAnySchema(ctx context.Context, steps ...func(gen.DBTX) error) error {
	return s.send(ctx, false, s.lockTimeoutStep(ctx), steps)
}

// lockTimeoutStep returns the UseLockTimeout step of s's lock timeout.
func (s *Postgres) lockTimeoutStep(ctx context.Context) func(gen.DBTX) error {
	return func(db gen.DBTX) error {
		return gen.New().UseLockTimeout(ctx, db, gen.UseLockTimeoutParams{LockTimeout: s.lockTimeout})
	}
}

// deadlockRetries is how many times send sends a batch again after the
// server chose it as a deadlock's victim (SQLSTATE 40P01). The store's
// statements lock rows in message_id order or skip locked rows, but a
// FOR UPDATE SKIP LOCKED that reaches a row version its updater has just
// committed locks the newer versions too, and PostgreSQL waits for their
// lockers there whatever the wait policy (the server log says "while
// locking updated version"): about once in 100,000 calls under
// TestSoakAllOperations. The victim's implicit transaction was rolled back
// whole, so sending the batch again is safe.
const deadlockRetries = 3

// send runs UseReadCommitted, settings and steps in one batch (see
// pipeline), once the store's schema check has passed (schemaReady) when
// checkSchema, again up to deadlockRetries times while the server reports a
// deadlock. The error passes through mapErr, so a lock timeout is
// ErrLockTimeout whichever statement hit it.
func (s *Postgres) send(ctx context.Context, checkSchema bool, settings func(gen.DBTX) error, steps []func(gen.DBTX) error) error {
	if checkSchema {
		if err := s.schemaReady(ctx); err != nil {
			return err
		}
	}
	for retry := 0; ; retry++ {
		err := s.sendOnce(ctx, s.pool, settings, steps)
		var pgErr *pgconn.PgError
		if retry == deadlockRetries || ctx.Err() != nil || !errors.As(err, &pgErr) || pgErr.Code != "40P01" {
			return err
		}
	}
}

// batchSender sends a batch: the pool (one implicit transaction) or an
// open transaction.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// sendOnce is one try of send, on db: UseReadCommitted, settings and
// steps in one batch.
func (s *Postgres) sendOnce(ctx context.Context, db batchSender, settings func(gen.DBTX) error, steps []func(gen.DBTX) error) error {
	readCommitted := func(db gen.DBTX) error { return gen.New().UseReadCommitted(ctx, db) }
	steps = append([]func(gen.DBTX) error{readCommitted, settings}, steps...)
	var rec pgbatch.Recorder
	for _, step := range steps {
		if err := step(&rec); !errors.Is(err, pgbatch.ErrCaptured) {
			return fmt.Errorf("leasing: record pipeline step: %v", err)
		}
	}
	if rec.Batch.Len() != len(steps) {
		return fmt.Errorf("leasing: pipeline recorded %d statements for %d steps", rec.Batch.Len(), len(steps))
	}
	results := db.SendBatch(ctx, &rec.Batch)
	var first error
	for _, step := range steps {
		if err := step(pgbatch.Replayer{Results: results}); err != nil {
			first = err
			break
		}
	}
	if err := results.Close(); first == nil {
		first = err
	}
	return mapErr(first)
}
