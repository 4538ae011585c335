package leasing

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leasestore/leasestore/gen"
	"github.com/leasestore/leasestore/internal/pgbatch"
)

// callClass names how send sets up a call's transaction. Every call sends
// its statements in one pgx batch: one round trip and one implicit
// transaction, which starts with a prelude local to it
// (db/queries/plans.sql), UseReadCommitted and the class's settings, at no
// extra round trip.
type callClass int

const (
	// hotPath is a processor's per-batch call (Claim, Renew, Release,
	// Complete, Fail, DeadLetter): generic plans and the lock timeout,
	// once the schema check passed. The generic plans are the index plans
	// (integration/plan_test.go); planning the claim per call costs more
	// than running it.
	hotPath callClass = iota
	// operator is every other call: plans left to the session (the best
	// may depend on the values) and the lock timeout, once the schema
	// check passed.
	operator
	// listing is operator with plans made for each call's values: the
	// operator's list, whose optional filters a generic plan cannot know
	// (leasing/postgres_list_plan_test.go).
	listing
	// anySchema is operator without the schema check, for the calls that
	// work on an older schema: Enqueue of unkeyed messages (producers keep
	// enqueuing during a migration), Stats and VacuumIfDead.
	anySchema
)

// step is one generated statement bound to its arguments.
type step interface {
	run(ctx context.Context, db gen.DBTX) error
}

// stmt is a step whose result is read from out after the send.
type stmt[P, R any] struct {
	fn  func(context.Context, gen.DBTX, P) (R, error)
	arg P
	out R
}

func (s *stmt[P, R]) run(ctx context.Context, db gen.DBTX) (err error) {
	s.out, err = s.fn(ctx, db, s.arg)
	return err
}

func (s *stmt[P, R]) result() R { return s.out }

// result is a step whose result is read after the send.
type result[R any] interface {
	step
	result() R
}

// bind returns the step that runs fn with arg.
func bind[P, R any](fn func(context.Context, gen.DBTX, P) (R, error), arg P) *stmt[P, R] {
	return &stmt[P, R]{fn: fn, arg: arg}
}

// deadlockRetries is how many times send sends a deadlock's victim
// (40P01) again: the lock order (db/queries/partials.sql.tmpl) leaves one
// rare cycle (docs/notes/2026-12-01-bounded-maintenance.md), and the victim
// was rolled back whole.
const deadlockRetries = 3

// send runs steps in one batch on s's pool as class says, again while the
// server reports a deadlock. When the server failed a statement none took
// effect; when reading a result failed on the client (context ended,
// connection lost), the batch may have committed.
func (s *Postgres) send(ctx context.Context, class callClass, steps ...step) error {
	if class != anySchema {
		if err := s.schemaReady(ctx); err != nil {
			return err
		}
	}
	for retry := 0; ; retry++ {
		err := s.sendOnce(ctx, s.pool, class, steps)
		var pgErr *pgconn.PgError
		if retry == deadlockRetries || ctx.Err() != nil || !errors.As(err, &pgErr) || pgErr.Code != "40P01" {
			return err
		}
	}
}

// sendOnce is one try of send on db, which may also be an open
// transaction (CheckPrivileges). It is the one place that maps the
// driver's errors (mapErr) for the statements it sends.
func (s *Postgres) sendOnce(ctx context.Context, db pgbatch.Sender, class callClass, steps []step) error {
	g := gen.New()
	settings := step(bind(noRows(g.UseLockTimeout), gen.UseLockTimeoutParams{LockTimeout: s.lockTimeout}))
	switch class {
	case hotPath:
		settings = bind(noRows(g.UseGenericPlansAndLockTimeout), gen.UseGenericPlansAndLockTimeoutParams{LockTimeout: s.lockTimeout})
	case listing:
		settings = bind(noRows(g.UseCustomPlansAndLockTimeout), gen.UseCustomPlansAndLockTimeoutParams{LockTimeout: s.lockTimeout})
	}
	all := append([]step{bind(exec(g.UseReadCommitted), struct{}{}), settings}, steps...)
	return mapErr(pgbatch.Send(ctx, db, runsOf(ctx, all)...))
}

// runsOf returns steps as pgbatch.Send takes them.
func runsOf(ctx context.Context, steps []step) []func(gen.DBTX) error {
	runs := make([]func(gen.DBTX) error, len(steps))
	for i, st := range steps {
		runs[i] = func(db gen.DBTX) error { return st.run(ctx, db) }
	}
	return runs
}

// sendIn sends steps in one batch, one round trip, on tx, the caller's
// transaction, with its settings untouched (EnqueueTx of keyed messages:
// the insert and EnqueueOrder), and maps the first error.
func sendIn(ctx context.Context, tx pgbatch.Sender, steps ...step) error {
	return mapErr(pgbatch.Send(ctx, tx, runsOf(ctx, steps)...))
}

// runIn runs steps one by one on db, the caller's transaction, with its
// settings untouched (EnqueueTx, EnqueueCopy) or on the pool outside any
// transaction (VACUUM), and maps the first error.
func runIn(ctx context.Context, db gen.DBTX, steps ...step) error {
	for _, st := range steps {
		if err := st.run(ctx, db); err != nil {
			return mapErr(err)
		}
	}
	return nil
}
