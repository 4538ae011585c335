package leasing

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"
)

// PostgresOptions configures a Postgres store. The zero value is the
// production setting.
type PostgresOptions struct {
	// Now, when not nil, pins the clock every statement uses in place of
	// the database's, for tests; production leaves it nil.
	Now func() time.Time

	// LockTimeout bounds how long each statement of a call waits for one
	// lock (lock_timeout, local to the call's transaction): past it the
	// call fails with ErrLockTimeout, having changed nothing. Whole
	// milliseconds, 1ms..MaxLockTimeout. It does not apply to EnqueueTx
	// and EnqueueCopy (the caller's transaction) nor to VacuumIfDead
	// (SKIP_LOCKED), nor to pgx's own statement preparation: give the
	// pool's sessions a lock_timeout too (docs/operations.md). Defaults
	// to DefaultLockTimeout.
	LockTimeout time.Duration

	// SkipSchemaCheck turns off the store's schema check (CheckSchema),
	// for tools that work on a schema that is behind (leasectl doctor).
	SkipSchemaCheck bool

	// TracerProvider, when not nil, traces enqueues as
	// MemoryOptions.TracerProvider does: a "send <queue>" producer span
	// per call whose W3C trace context goes into each message's headers
	// (a traceparent or tracestate already there is kept and linked, at
	// most MaxSendLinks a call). For EnqueueTx and EnqueueCopy the span
	// ends before the caller's transaction does. nil starts no span.
	TracerProvider trace.TracerProvider
}

// DefaultLockTimeout is PostgresOptions.LockTimeout when it is 0. The
// store's statements hold row locks for milliseconds and claims skip
// locked rows, so it fires only behind DDL; five tries of an outcome write
// fit in the default 30-second lease.
const DefaultLockTimeout = 5 * time.Second

// MaxLockTimeout is the longest PostgresOptions.LockTimeout, PostgreSQL's
// limit (2^31-1 ms): it waits for locks as long as the context allows.
const MaxLockTimeout = time.Duration(1<<31-1) * time.Millisecond

// lockTimeoutSetting validates d (see PostgresOptions.LockTimeout) and
// returns it as the text UseLockTimeout sets, in milliseconds.
func lockTimeoutSetting(d time.Duration) (string, error) {
	switch {
	case d == 0:
		d = DefaultLockTimeout
	case d < time.Millisecond:
		return "", argumentError("lock timeout", "must be 0 (the default, %s) or 1ms..%s, got %s", DefaultLockTimeout, MaxLockTimeout, d)
	case d > MaxLockTimeout:
		return "", argumentError("lock timeout", "must be at most %s, got %s", MaxLockTimeout, d)
	}
	return fmt.Sprintf("%dms", d.Milliseconds()), nil
}

// Postgres is the PostgreSQL Store for one queue, over a pgx pool and the
// sqlc queries in db/queries. Each method runs its statements in a
// transaction of its own, in one round trip (see callClass), at READ
// COMMITTED whatever the database's default isolation, with
// PostgresOptions.LockTimeout; the settings never reach the session.
// EnqueueTx and EnqueueCopy join the caller's transaction, and
// VacuumIfDead runs VACUUM outside any transaction.
type Postgres struct {
	pool        *pgxpool.Pool
	queue       Queue
	q           queries
	now         func() time.Time
	lockTimeout string // lock_timeout setting, e.g. "5000ms"
	tracing     tracing

	schemaTurn chan struct{} // holds a token while the schema check runs
	schemaOK   atomic.Bool   // the schema check passed, or is skipped
	skipCheck  bool          // PostgresOptions.SkipSchemaCheck
}

var _ Store = (*Postgres)(nil)

// NewPostgres returns the store for queue q over pool, migrated with
// db.MigrateUp. It sends nothing: the first call that needs this version's
// schema runs CheckSchema and fails with its *SchemaError while the schema
// is behind; call CheckSchema at startup to learn it sooner.
//
// The pool may use any pgx query exec mode; behind a transaction-mode
// pooler (no call relies on session state) use exec, cache_describe or
// simple_protocol (docs/notes/2026-12-01-poolers-and-query-modes.md).
//
// Errors: an *ArgumentError for a nil pool, an unknown queue or a
// LockTimeout out of range.
func NewPostgres(pool *pgxpool.Pool, q Queue, opts PostgresOptions) (*Postgres, error) {
	if pool == nil {
		return nil, argumentError("pool", "must not be nil")
	}
	if _, err := ParseQueue(string(q)); err != nil {
		return nil, err
	}
	lockTimeout, err := lockTimeoutSetting(opts.LockTimeout)
	if err != nil {
		return nil, err
	}
	s := &Postgres{pool: pool, queue: q, q: queriesFor(q), now: opts.Now, lockTimeout: lockTimeout, tracing: newTracing(opts.TracerProvider),
		schemaTurn: make(chan struct{}, 1)}
	s.schemaOK.Store(opts.SkipSchemaCheck)
	s.skipCheck = opts.SkipSchemaCheck
	return s, nil
}

// CheckSchema runs the package's CheckSchema for the store's queue. Once a
// check passed the store does not check again; a failed check is repeated
// by the next call, so the store recovers once the migration ran.
//
// Errors: a *SchemaError (errors.Is ErrSchema) naming the migrations not
// applied and the indexes missing or invalid; else the driver error.
func (s *Postgres) CheckSchema(ctx context.Context) error {
	if err := CheckSchema(ctx, s.pool, s.queue); err != nil {
		return err
	}
	s.schemaOK.Store(true)
	return nil
}

// schemaReady runs CheckSchema unless a check passed (or is skipped), one
// at a time; a call waiting for another's check gives up when its own
// context ends.
func (s *Postgres) schemaReady(ctx context.Context) error {
	if s.schemaOK.Load() {
		return nil
	}
	select {
	case s.schemaTurn <- struct{}{}:
	default: // another call's check runs: wait for it
		select {
		case s.schemaTurn <- struct{}{}:
		case <-ctx.Done():
			return fmt.Errorf("leasing: wait for the schema check: %w", ctx.Err())
		}
	}
	defer func() { <-s.schemaTurn }()
	if s.schemaOK.Load() {
		return nil
	}
	return s.CheckSchema(ctx)
}

// Queue returns the queue this store serves.
func (s *Postgres) Queue() Queue { return s.queue }

// Pool returns the pool the store runs on.
func (s *Postgres) Pool() *pgxpool.Pool { return s.pool }

// pinned returns a statement's now parameter: nil (the database clock)
// unless PostgresOptions.Now is set.
func (s *Postgres) pinned() *time.Time {
	if s.now == nil {
		return nil
	}
	t := s.now()
	return &t
}
