package leasing

import (
	"context"
	"errors"
	"fmt"

	"github.com/leasestore/leasestore/gen"
	"github.com/leasestore/leasestore/internal/pgbatch"
)

// A pipeline sends several generated statements in one round trip: each
// step runs once on a pgbatch.Recorder, which queues its statement, and once
// on a pgbatch.Replayer after the batch was sent, which hands it its result.
//
// pgx sends a batch outside a transaction as one implicit transaction: the
// statements commit together, once, or not at all.

// pipeline runs steps, each one generated statement on the gen.DBTX it is
// given, in one round trip and one implicit transaction on s's pool, after
// the store's schema check has passed once (schemaReady) and after
// UseGenericPlans: pgx prepares each statement once per connection, and the
// generic plan is then reused (the claim's and the fenced writes' generic
// plans are their custom index plans; integration/plan_test.go checks both).
// Planning the claim for every call costs more than running it at small
// batches. It returns the first error: a step's, or the batch's. When
// the server failed a statement, no statement took effect; when reading a
// result failed on the client (context ended, connection lost, decode
// error), the batch may have committed.
func (s *Postgres) pipeline(ctx context.Context, steps ...func(gen.DBTX) error) error {
	if err := s.schemaReady(ctx); err != nil {
		return err
	}
	generic := func(db gen.DBTX) error { return gen.New().UseGenericPlans(ctx, db) }
	steps = append([]func(gen.DBTX) error{generic}, steps...)
	var rec pgbatch.Recorder
	for _, step := range steps {
		if err := step(&rec); !errors.Is(err, pgbatch.ErrCaptured) {
			return fmt.Errorf("leasing: record pipeline step: %v", err)
		}
	}
	if rec.Batch.Len() != len(steps) {
		return fmt.Errorf("leasing: pipeline recorded %d statements for %d steps", rec.Batch.Len(), len(steps))
	}
	results := s.pool.SendBatch(ctx, &rec.Batch)
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
	return first
}
