package leasing

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/gen"
	"github.com/leasestore/leasestore/internal/pgbatch"
	"github.com/leasestore/leasestore/internal/wait"
)

// callClass names how send sets up a call's transaction. Every call sends
// its statements in one pgx batch: one round trip and one transaction,
// opened at READ COMMITTED (BeginReadCommitted, db/queries/plans.sql) and
// set up with the class's settings, local to it, then committed
// (CommitCall), all at no extra round trip.
type callClass int

const (
	// hotPath is a processor's per-batch call (Claim, Renew, Release,
	// ReleaseAfter, Complete, CompleteAndClaim, Fail, DeadLetter): generic
	// plans and the lock timeout, once the schema check passed. The
	// generic plans are the index plans (integration/plan_test.go);
	// planning the claim per call costs more than running it.
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

// ErrUnavailable is matched by the error of a Postgres call that found no
// writable primary: the server is read-only (SQLSTATE 25006: a standby,
// or a primary demoted in a failover), shutting down or restarting
// (57P01, 57P02, 57P03), refused or timed out the connection, or the
// connection broke. The store discarded the connection, so the pool
// connects anew (with target_session_attrs=read-write in a multi-host URL,
// to the new primary: docs/high-availability.md). The error wraps the
// driver's.
//
// A call that could not commit (no connection, nothing sent, or a write
// refused with 25006) was sent again unavailableRetries times, over about
// UnavailableRetryWait, before it returned this error; nothing changed. A
// call whose session ended (57P01, 57P02) returns at once: when a
// statement's result carried the error nothing committed, but
// pg_terminate_backend ends sessions with 57P01 too. A call whose connection broke after it was sent may
// have committed, as any call whose reply was lost (see Store): a retried
// write then reports OutcomeAlreadyApplied. Retry after a pause; a
// failover takes seconds.
var ErrUnavailable = errors.New("leasing: database unavailable")

// unavailableRetries is how many times send sends a call again that found
// no writable primary before it could commit, waiting unavailableBackoff,
// doubled each time, before each try.
const (
	unavailableRetries = 3
	unavailableBackoff = 50 * time.Millisecond
)

// UnavailableRetryWait is about how long a call retries inside the store
// when it finds no writable primary, before it returns ErrUnavailable:
// unavailableRetries waits of 50, 100 and 200 milliseconds.
const UnavailableRetryWait = unavailableBackoff * (1<<unavailableRetries - 1)

// send runs steps in one batch on s's pool as class says, again while the
// server reports a deadlock, and again (unavailableRetries times) while
// the call finds no writable primary before it could commit. When the
// server failed a statement none took effect; when reading a result failed
// on the client (context ended, connection lost), the batch may have
// committed.
func (s *Postgres) send(ctx context.Context, class callClass, steps ...step) error {
	if class != anySchema {
		if err := s.schemaReady(ctx); err != nil {
			return err
		}
	}
	deadlocks, unavailable := 0, 0
	for {
		uncommitted, err := s.sendPooled(ctx, class, steps)
		var pgErr *pgconn.PgError
		switch {
		case err == nil || ctx.Err() != nil:
			return err
		case errors.As(err, &pgErr) && pgErr.Code == "40P01" && deadlocks < deadlockRetries:
			deadlocks++
		case errors.Is(err, ErrUnavailable) && uncommitted && unavailable < unavailableRetries:
			if !wait.Sleep(ctx, unavailableBackoff<<unavailable) {
				return err
			}
			unavailable++
		default:
			return err
		}
	}
}

// sendPooled is one try of send on a connection of s's pool. It discards
// a connection that reached a read-only server (the pool destroys a closed
// connection on release), and maps a broken connection to ErrUnavailable.
// uncommitted reports that the call cannot have committed and may be sent
// again: no connection, nothing sent, or a write refused as read-only.
func (s *Postgres) sendPooled(ctx context.Context, class callClass, steps []step) (uncommitted bool, err error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		// Only a failed connect is the server's unavailability; a closed
		// pool is the caller's.
		var connectErr *pgconn.ConnectError
		if ctx.Err() != nil || !errors.As(err, &connectErr) {
			return false, err
		}
		return true, fmt.Errorf("%w: connect: %w", ErrUnavailable, err)
	}
	defer conn.Release()
	var replayed int
	err = s.sendCounted(ctx, conn, class, steps, &replayed)
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return false, nil
	case errors.As(err, &pgErr) && pgErr.Code == "25006":
		// A healthy connection to a standby: close it, or the pool hands
		// it out again.
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = conn.Conn().Close(closeCtx)
	case ctx.Err() == nil && conn.Conn().IsClosed() && !errors.Is(err, ErrUnavailable):
		err = fmt.Errorf("%w: %w", ErrUnavailable, err)
	default:
		rollbackAborted(ctx, conn)
	}
	// A refused write (25006) is a statement's error: the call's
	// transaction rolled back. A session ended by 57P01 did not commit
	// either when a statement's result carried it, but
	// pg_terminate_backend ends sessions with it too: an operator's kill
	// is reported, not sent again.
	refused := replayed < len(steps)+2 && errors.As(err, &pgErr) && pgErr.Code == "25006"
	return refused || pgconn.SafeToRetry(err), err
}

// rollbackTimeout bounds the rollback of a call's aborted transaction,
// which runs even when the call's context has ended.
const rollbackTimeout = 5 * time.Second

// rollbackAborted ends the transaction of a failed call on conn, which a
// statement's error left aborted, so that the pool keeps the connection:
// it destroys one released in a transaction. A connection whose rollback
// fails is closed, for the pool to replace.
func rollbackAborted(ctx context.Context, conn *pgxpool.Conn) {
	c := conn.Conn()
	if c.IsClosed() || c.PgConn().TxStatus() == 'I' {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	if err := gen.New().RollbackCall(rctx, c); err != nil {
		_ = c.Close(rctx)
	}
}

// sendOnce runs steps after class's settings in one batch in tx, an open
// transaction at READ COMMITTED (CheckPrivileges), which it leaves open.
// Like sendCounted, it maps the driver's errors (mapErr).
func (s *Postgres) sendOnce(ctx context.Context, tx pgx.Tx, class callClass, steps []step) error {
	all := append([]step{s.settings(class)}, steps...)
	return mapErr(pgbatch.Send(ctx, tx, runsOf(ctx, all, nil)...))
}

// sendCounted runs steps in a transaction of their own on db, a pooled
// connection: BeginReadCommitted, class's settings, steps, CommitCall, in
// one batch. It is the one place, with sendOnce, that maps the driver's
// errors (mapErr) for the statements it sends, and counts in replayed the
// statements, the first two included, whose results were read without an
// error.
func (s *Postgres) sendCounted(ctx context.Context, db pgbatch.Sender, class callClass, steps []step, replayed *int) error {
	g := gen.New()
	all := make([]step, 0, len(steps)+3)
	all = append(all, bind(exec(g.BeginReadCommitted), struct{}{}), s.settings(class))
	all = append(all, steps...)
	all = append(all, bind(exec(g.CommitCall), struct{}{}))
	return mapErr(pgbatch.Send(ctx, db, runsOf(ctx, all, replayed)...))
}

// settings returns the statement that sets class's settings for the rest
// of the current transaction (db/queries/plans.sql).
func (s *Postgres) settings(class callClass) step {
	g := gen.New()
	switch class {
	case hotPath:
		return bind(noRows(g.UseHotPathSettings), gen.UseHotPathSettingsParams{LockTimeout: s.lockTimeout})
	case listing:
		return bind(noRows(g.UseCustomPlansAndLockTimeout), gen.UseCustomPlansAndLockTimeoutParams{LockTimeout: s.lockTimeout})
	default:
		return bind(noRows(g.UseLockTimeout), gen.UseLockTimeoutParams{LockTimeout: s.lockTimeout})
	}
}

// runsOf returns steps as pgbatch.Send takes them; replayed, when not nil,
// counts the steps whose results were read without an error.
func runsOf(ctx context.Context, steps []step, replayed *int) []func(gen.DBTX) error {
	runs := make([]func(gen.DBTX) error, len(steps))
	for i, st := range steps {
		runs[i] = func(db gen.DBTX) error {
			err := st.run(ctx, db)
			if err == nil && replayed != nil { // a Recorder's pass never returns nil
				*replayed++
			}
			return err
		}
	}
	return runs
}

// sendIn sends steps in one batch, one round trip, on tx, the caller's
// transaction, with its settings untouched (EnqueueTx of keyed messages:
// the insert and EnqueueOrder), and maps the first error.
func sendIn(ctx context.Context, tx pgbatch.Sender, steps ...step) error {
	return mapErr(pgbatch.Send(ctx, tx, runsOf(ctx, steps, nil)...))
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
