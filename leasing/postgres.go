package leasing

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/leasestore/leasestore/gen"
)

// PostgresOptions configures a Postgres store. The zero value is the
// production setting.
type PostgresOptions struct {
	// Now, when not nil, pins the clock every statement uses in place of the
	// database's. It exists for tests that must step time without sleeping;
	// production leaves it nil so that the database clock decides.
	Now func() time.Time

	// LockTimeout bounds how long each statement of a call waits for one
	// lock (PostgreSQL's lock_timeout, set local to the call's own
	// transaction): a queue table locked by DDL, or a row locked by a long
	// transaction, makes the call fail with ErrLockTimeout within about
	// that time, having changed nothing, instead of holding a pool
	// connection for as long as the lock lasts. 1ms..MaxLockTimeout,
	// a whole number of milliseconds is sent (sub-millisecond parts are
	// dropped). Defaults to DefaultLockTimeout.
	//
	// It does not apply to EnqueueTx and EnqueueCopy, which run in the
	// caller's transaction and keep its settings, nor to VacuumIfDead,
	// whose VACUUM skips a locked table. statement_timeout is left as the
	// session has it: the call's context bounds how long a call runs.
	//
	// In pgx's cache_statement and cache_describe query modes (pgx's
	// default is cache_statement), pgx prepares or describes a statement
	// that is new to the connection, and again after any failed call on
	// it, in a round trip of its own before the call's transaction; that
	// preparation parses the statement, which waits for a locked table
	// under the session's lock_timeout only. To bound it too, give the
	// pool's sessions a lock_timeout as well (connection string
	// options=-c lock_timeout=5s, or ALTER ROLE ... SET lock_timeout), or
	// use the exec query mode.
	LockTimeout time.Duration

	// SkipSchemaCheck turns off the check that the store's first call
	// runs (see Postgres.CheckSchema), for tools that must work on a
	// database whose schema is behind, such as leasectl doctor.
	SkipSchemaCheck bool

	// TracerProvider, when not nil, traces enqueues: Enqueue, EnqueueTx
	// and EnqueueCopy each start a "send <queue>" span (kind producer), a
	// child of the span in their context, and store its W3C trace context
	// in every message's headers (HeaderTraceParent, HeaderTraceState),
	// where the processor's process span links to it. A message whose
	// headers hold a traceparent or tracestate string already keeps its
	// headers as they are, and the send span links to the context they
	// name (at most MaxSendLinks distinct contexts a call); a trace key
	// holding anything else (null, a number) is replaced. The span ends when the call returns, so for EnqueueTx
	// and EnqueueCopy before the caller's transaction commits or rolls
	// back. nil, the default, starts no span and adds no header.
	// MemoryOptions.TracerProvider is the same for Memory.
	TracerProvider trace.TracerProvider
}

// DefaultLockTimeout is PostgresOptions.LockTimeout when it is 0: 5
// seconds. The store's own statements hold row locks for one statement
// each (milliseconds) and claims skip locked rows, so it never fires
// between processors; DDL that holds or waits for the queue table's
// ACCESS EXCLUSIVE lock fails calls within 5 seconds instead of queueing
// every one behind it. Five tries of an outcome write (the processor's)
// fit in the default 30-second lease.
const DefaultLockTimeout = 5 * time.Second

// MaxLockTimeout is the longest PostgresOptions.LockTimeout, PostgreSQL's
// limit for lock_timeout (2^31-1 milliseconds, about 24.8 days): the value
// that waits for locks as long as the context allows.
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
// transaction of its own, one round trip (an implicit transaction of one
// pgx batch); EnqueueTx and EnqueueCopy join the caller's transaction, and
// VacuumIfDead runs VACUUM, which cannot run in a transaction.
//
// Each own transaction starts with settings local to it
// (db/queries/plans.sql): READ COMMITTED isolation, whatever
// default_transaction_isolation the database, the role or the session sets
// (serializable or repeatable read would turn a claim or fenced write that
// met a concurrent update into a serialization failure), and
// PostgresOptions.LockTimeout. Claim, CompleteAndClaim, Renew, Release,
// Complete, Fail and DeadLetter, the calls a processor makes for every
// batch, also set plan_cache_mode = force_generic_plan: PostgreSQL reuses
// the statement's generic plan instead of planning it again for every
// call. The settings end with that transaction and never reach the
// session.
type Postgres struct {
	pool        *pgxpool.Pool
	queue       Queue
	sql         queueSQL
	now         func() time.Time
	lockTimeout string // lock_timeout setting, e.g. "5000ms"
	tracing     tracing

	// schemaTurn holds a token while the lazy schema check runs: a call
	// that finds it taken waits for it as long as its own context allows.
	schemaTurn chan struct{}
	schemaOK   atomic.Bool // the schema check passed, or is skipped
	skipCheck  bool        // PostgresOptions.SkipSchemaCheck
}

var _ Store = (*Postgres)(nil)

// NewPostgres returns the store for queue q over pool. The schema must be
// migrated (db.MigrateUp). NewPostgres sends nothing: the first call that
// needs this version's schema (every method but Enqueue, EnqueueTx,
// EnqueueCopy, Stats and VacuumIfDead, which work on an older one) first
// runs CheckSchema, and fails with its *SchemaError, without running,
// while the schema is behind; call CheckSchema at startup to learn it
// sooner.
//
// The pool may use any pgx query exec mode, and may go through a
// transaction-mode pooler (PgBouncer, Supavisor, RDS Proxy): no call relies
// on session state between transactions. Behind such a pooler set
// default_query_exec_mode=exec (or cache_describe, or simple_protocol);
// cache_statement and describe_exec need a session of their own.
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
	s := &Postgres{pool: pool, queue: q, sql: sqlFor(q), now: opts.Now, lockTimeout: lockTimeout, tracing: newTracing(opts.TracerProvider),
		schemaTurn: make(chan struct{}, 1)}
	s.schemaOK.Store(opts.SkipSchemaCheck)
	s.skipCheck = opts.SkipSchemaCheck
	return s, nil
}

// CheckSchema checks, with the package's CheckSchema, that the database
// holds every migration this version of the code needs and every index
// they create on the store's table, present and valid. A database migrated
// further than the code knows passes: during a rolling deploy, older code
// runs on a newer schema, and newer code fails clearly on an older one.
// Once a check passed, the store does not check again (leasectl doctor
// reports an index lost later); a failed check is repeated by the next
// call, so the store recovers once the migration ran.
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

// schemaReady runs CheckSchema unless a check passed (or is skipped); one
// check at a time. A call that waits for another call's check gives up
// with its own context's error when that ends first: a check stuck behind
// an exhausted pool or a lock does not hold callers past their deadlines.
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

// pinned returns the pinned clock for a statement's now parameter: nil,
// meaning the database clock, unless PostgresOptions.Now is set.
func (s *Postgres) pinned() *time.Time {
	if s.now == nil {
		return nil
	}
	t := s.now()
	return &t
}

// Enqueue implements Store.Enqueue in its own transaction, at READ
// COMMITTED with the store's lock timeout.
//
// Errors: an *ArgumentError for bad messages (nothing sent); ErrDuplicate
// for an outbox id already present; an *OrderingKeyConflictError for a
// keyed inbox duplicate of another ordering key; a *SchemaError (errors.Is
// ErrSchema) for keyed messages while the schema is behind; ErrLockTimeout;
// nothing is inserted after any of these. Otherwise the driver error.
func (s *Postgres) Enqueue(ctx context.Context, msgs ...NewMessage) (EnqueueResult, error) {
	return s.enqueue(ctx, nil, msgs)
}

// EnqueueTx is Enqueue inside the caller's transaction tx, so that messages
// commit or roll back with the business change that produced them: the
// transactional outbox. One INSERT statement for the whole batch. Begin tx
// on the store's pool or any connection to the same database, e.g. with
// pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { ... }).
//
// The INSERT runs with tx's settings, untouched: its isolation level and
// its lock_timeout, not READ COMMITTED and PostgresOptions.LockTimeout. In
// a REPEATABLE READ or SERIALIZABLE tx, an inbox duplicate that another
// transaction committed after tx took its snapshot fails the INSERT with a
// serialization failure (SQLSTATE 40001, the transaction is aborted) where
// READ COMMITTED skips it: retry tx, as for any serialization failure. Set
// lock_timeout in tx yourself (SET LOCAL lock_timeout) to bound its wait
// behind DDL.
//
// Errors: an *ArgumentError for bad messages (nothing sent); ErrDuplicate
// for an outbox id already present; an *OrderingKeyConflictError for a
// keyed inbox duplicate of another ordering key; ErrLockTimeout when tx's
// own lock_timeout ran out. After ErrDuplicate, the conflict error and
// ErrLockTimeout the transaction is aborted. Otherwise the driver error
// (EnqueueTx runs no schema check: keyed messages on a schema before
// migration 00010 fail with PostgreSQL's error for the missing column).
func (s *Postgres) EnqueueTx(ctx context.Context, tx pgx.Tx, msgs ...NewMessage) (EnqueueResult, error) {
	if tx == nil {
		return EnqueueResult{}, argumentError("tx", "must not be nil")
	}
	return s.enqueue(ctx, tx, msgs)
}

// enqueue inserts msgs in tx, or in a transaction of its own when tx is nil.
func (s *Postgres) enqueue(ctx context.Context, tx pgx.Tx, msgs []NewMessage) (res EnqueueResult, err error) {
	msgs, err = validateMessages(s.queue, msgs)
	if err != nil {
		return EnqueueResult{}, err
	}
	ctx, span, msgs := s.tracing.send(ctx, s.queue, msgs)
	defer func() { endSend(span, len(res.Duplicates), err) }()
	now := s.pinned()
	var inserted []uuid.UUID
	steps := []func(gen.DBTX) error{func(db gen.DBTX) (err error) { inserted, err = s.sql.enqueue(ctx, db, now, msgs); return err }}
	if hasKeys(msgs) {
		// Keyed rows take their places in their keys' lines in a second
		// statement of the same transaction (db/queries InboxEnqueueOrder).
		ids := make([]uuid.UUID, len(msgs))
		for i, m := range msgs {
			ids[i] = m.ID
		}
		steps = append(steps, func(db gen.DBTX) error { _, err := s.sql.enqueueOrder(ctx, db, now, ids); return err })
	}
	switch {
	case tx != nil:
		for _, step := range steps {
			if err = step(tx); err != nil {
				break
			}
		}
	case hasKeys(msgs):
		err = s.pipelineSessionPlans(ctx, steps...)
	default:
		err = s.pipelineAnySchema(ctx, steps...)
	}
	if err != nil {
		return EnqueueResult{}, fmt.Errorf("leasing: enqueue %s: %w", s.queue, err)
	}
	return enqueueResult(msgs, inserted), nil
}

// EnqueueCopy bulk-loads msgs with COPY inside the caller's transaction tx:
// the fastest way to add many messages. Rows are due at once (Delay must be
// 0) and get the database clock; a duplicate id or idempotency key fails
// the whole copy. Returns the ids in input order. COPY runs with tx's
// settings, untouched: its isolation level and its lock_timeout, not
// PostgresOptions.LockTimeout (see EnqueueTx).
//
// Errors: an *ArgumentError for bad messages or a non-zero Delay;
// ErrDuplicate for an id or idempotency key already present; ErrLockTimeout
// when tx's own lock_timeout ran out; otherwise the driver error.
func (s *Postgres) EnqueueCopy(ctx context.Context, tx pgx.Tx, msgs ...NewMessage) ([]uuid.UUID, error) {
	msgs, err := validateMessages(s.queue, msgs)
	if err != nil {
		return nil, err
	}
	ids := make([]uuid.UUID, len(msgs))
	for i, m := range msgs {
		if m.Delay != 0 {
			return nil, argumentError("delay", "EnqueueCopy rows are due at once; use Enqueue for message %d", i)
		}
		ids[i] = m.ID
	}
	ctx, span, msgs := s.tracing.send(ctx, s.queue, msgs)
	if _, err := s.sql.enqueueCopy(ctx, tx, msgs); err != nil {
		err = fmt.Errorf("leasing: copy into %s: %w", s.queue, err)
		endSend(span, 0, err)
		return nil, err
	}
	if hasKeys(msgs) {
		if _, err := s.sql.enqueueOrder(ctx, tx, s.pinned(), ids); err != nil {
			err = fmt.Errorf("leasing: copy into %s: order keys: %w", s.queue, err)
			endSend(span, 0, err)
			return nil, err
		}
	}
	endSend(span, 0, nil)
	return ids, nil
}

// Claim implements Store.Claim with one statement: see db/queries InboxClaim.
// Rows it parks come back as a *ParkedError beside the leases.
func (s *Postgres) Claim(ctx context.Context, r ClaimRequest) ([]Lease, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	var (
		leases []Lease
		parked []ParkedRow
	)
	err := s.pipeline(ctx, func(db gen.DBTX) (err error) { leases, parked, err = s.runClaim(ctx, db, r); return err })
	if err != nil {
		return nil, fmt.Errorf("leasing: claim %s: %w", s.queue, err)
	}
	return leases, parkedError(s.queue, parked, s.releaseParked(ctx, parked))
}

// runClaim sends the claim statement for r on db: the tenant's claim when
// r names a tenant, else the untenanted one.
func (s *Postgres) runClaim(ctx context.Context, db gen.DBTX, r ClaimRequest) ([]Lease, []ParkedRow, error) {
	args := claimArgs{now: s.pinned(), owner: r.Owner, batchSize: int32(r.BatchSize), leaseFor: r.LeaseFor, tenantID: r.TenantID}
	if r.TenantID != "" {
		return s.sql.claimTenant(ctx, db, args)
	}
	return s.sql.claim(ctx, db, args)
}

// Renew implements Store.Renew with one statement for the batch.
func (s *Postgres) Renew(ctx context.Context, leaseFor time.Duration, leases ...Lease) (RenewResult, error) {
	owner, err := validateLeases(s.queue, leases)
	if err == nil {
		err = validateLeaseFor(leaseFor)
	}
	if err != nil {
		return RenewResult{}, err
	}
	f := s.fence(owner, leases)
	var expiry map[uuid.UUID]time.Time
	err = s.pipeline(ctx, func(db gen.DBTX) (err error) { expiry, err = s.sql.renew(ctx, db, f, leaseFor); return err })
	if err != nil {
		return RenewResult{}, fmt.Errorf("leasing: renew %s: %w", s.queue, err)
	}
	return renewResult(leases, expiry), nil
}

// Release implements Store.Release with one statement for the batch.
func (s *Postgres) Release(ctx context.Context, leases ...Lease) (WriteResult, error) {
	owner, err := validateLeases(s.queue, leases)
	if err != nil {
		return WriteResult{}, err
	}
	f := s.fence(owner, leases)
	return s.write(ctx, "release", func(db gen.DBTX) ([]MessageOutcome, error) { return s.sql.release(ctx, db, f) }, nil)
}

// ReleaseOrphans implements Store.ReleaseOrphans with one statement.
func (s *Postgres) ReleaseOrphans(ctx context.Context, owner string, held []uuid.UUID) ([]uuid.UUID, error) {
	if err := validateOwner(owner); err != nil {
		return nil, err
	}
	if held == nil {
		held = []uuid.UUID{}
	}
	now := s.pinned()
	var ids []uuid.UUID
	err := s.pipelineSessionPlans(ctx, func(db gen.DBTX) (err error) { ids, err = s.sql.releaseOrphans(ctx, db, now, owner, held); return err })
	if err != nil {
		return nil, fmt.Errorf("leasing: release orphans %s: %w", s.queue, err)
	}
	return ids, nil
}

// Complete implements Store.Complete with one statement for the batch.
func (s *Postgres) Complete(ctx context.Context, leases ...Lease) (WriteResult, error) {
	owner, err := validateLeases(s.queue, leases)
	if err != nil {
		return WriteResult{}, err
	}
	f := s.fence(owner, leases)
	return s.write(ctx, "complete", func(db gen.DBTX) ([]MessageOutcome, error) { return s.sql.complete(ctx, db, f) }, keyedIDs(leases))
}

// CompleteAndClaim implements Store.CompleteAndClaim: the Complete
// statement and the Claim statement go to the server in one pgx.Batch, one
// network round trip, and commit together in one implicit transaction (one
// WAL flush). With no done leases it is Claim.
func (s *Postgres) CompleteAndClaim(ctx context.Context, done []Lease, r ClaimRequest) (WriteResult, []Lease, error) {
	if len(done) == 0 {
		leases, err := s.Claim(ctx, r)
		return WriteResult{Outcomes: []MessageOutcome{}}, leases, err
	}
	owner, err := validateLeases(s.queue, done)
	if err == nil {
		err = r.Validate()
	}
	if err != nil {
		return WriteResult{}, nil, err
	}
	f := s.fence(owner, done)
	var (
		outcomes []MessageOutcome
		leases   []Lease
		parked   []ParkedRow
	)
	// The keys the completes free are promoted before the claim, which
	// then sees the promoted messages.
	steps := append([]func(gen.DBTX) error{
		func(db gen.DBTX) (err error) { outcomes, err = s.sql.complete(ctx, db, f); return err },
	}, s.keySteps(ctx, keyedIDs(done))...)
	steps = append(steps, func(db gen.DBTX) (err error) { leases, parked, err = s.runClaim(ctx, db, r); return err })
	if err = s.pipeline(ctx, steps...); err != nil {
		return WriteResult{}, nil, fmt.Errorf("leasing: complete and claim %s: %w", s.queue, err)
	}
	return WriteResult{Outcomes: outcomes}, leases, parkedError(s.queue, parked, s.releaseParked(ctx, parked))
}

// Fail implements Store.Fail with one statement for the batch.
func (s *Postgres) Fail(ctx context.Context, failures ...Failure) (WriteResult, error) {
	owner, err := validateFailures(s.queue, failures)
	if err != nil {
		return WriteResult{}, err
	}
	f := s.failArgs(owner, failures)
	return s.write(ctx, "fail", func(db gen.DBTX) ([]MessageOutcome, error) { return s.sql.fail(ctx, db, f) }, nil)
}

// DeadLetter implements Store.DeadLetter with one statement for the batch.
func (s *Postgres) DeadLetter(ctx context.Context, failures ...Failure) (WriteResult, error) {
	owner, err := validateFailures(s.queue, failures)
	if err != nil {
		return WriteResult{}, err
	}
	f := s.failArgs(owner, failures)
	return s.write(ctx, "dead-letter", func(db gen.DBTX) ([]MessageOutcome, error) { return s.sql.deadLetter(ctx, db, f) },
		keyedIDs(leasesOf(failures)))
}

// write runs one fenced write statement (see pipeline), then, in the same
// transaction, the key steps for keyed, the ids of the keyed messages it
// may finish (keySteps), and wraps its error with op and the queue.
func (s *Postgres) write(ctx context.Context, op string, stmt func(gen.DBTX) ([]MessageOutcome, error), keyed []uuid.UUID) (WriteResult, error) {
	var out []MessageOutcome
	steps := append([]func(gen.DBTX) error{func(db gen.DBTX) (err error) { out, err = stmt(db); return err }}, s.keySteps(ctx, keyed)...)
	err := s.pipeline(ctx, steps...)
	if err != nil {
		return WriteResult{}, fmt.Errorf("leasing: %s %s: %w", op, s.queue, err)
	}
	return WriteResult{Outcomes: out}, nil
}

// Requeue implements Store.Requeue with one statement, which locks the
// rows in message_id order (the store's one lock order).
func (s *Postgres) Requeue(ctx context.Context, ids ...uuid.UUID) (RequeueResult, error) {
	if err := validateIDs(ids); err != nil {
		return RequeueResult{}, err
	}
	now := s.pinned()
	var requeued []uuid.UUID
	err := s.pipelineSessionPlans(ctx, func(db gen.DBTX) (err error) { requeued, err = s.sql.requeue(ctx, db, now, ids); return err })
	if err != nil {
		return RequeueResult{}, fmt.Errorf("leasing: requeue %s: %w", s.queue, err)
	}
	return RequeueResult{Requested: len(ids), Requeued: requeued}, nil
}

// RequeueAll implements Store.RequeueAll in batches of at most MaxBatchSize
// rows, each its own statement and transaction: the oldest dead letters
// first, read through the dead-letter index and locked in message_id
// order, until a batch finds none left. Each batch costs the rows it
// requeues, so no statement holds locks on more than MaxBatchSize rows.
// Only rows dead-lettered at or before the first batch's database now are
// taken, so a message that is dead-lettered again after its requeue (while
// processors run) is left for the next call and the loop ends.
//
// Not atomic: when a batch fails, the batches before it stay committed,
// and the error wraps the driver's; calling RequeueAll again requeues the
// rest. Requeued is then not returned.
func (s *Postgres) RequeueAll(ctx context.Context) (RequeueResult, error) {
	requeued := []uuid.UUID{}
	var before *time.Time
	for {
		var b requeueBatch
		err := s.pipelineSessionPlans(ctx, func(db gen.DBTX) (err error) {
			b, err = s.sql.requeueBatch(ctx, db, s.pinned(), before, MaxBatchSize)
			return err
		})
		if err != nil {
			return RequeueResult{}, fmt.Errorf("leasing: requeue %s (after %d requeued): %w", s.queue, len(requeued), err)
		}
		if b.locked == 0 {
			break
		}
		requeued = append(requeued, b.requeued...)
		before = &b.before
	}
	slices.SortFunc(requeued, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	return RequeueResult{Requested: len(requeued), Requeued: requeued}, nil
}

// Purge implements Store.Purge: one DELETE of at most r.BatchSize rows,
// oldest finish time first, that skips rows locked by others, so it never
// waits for a lock nor holds long ones. It reads the finished rows through
// their finish-time indexes (migrations 00007 and 00008) and costs the rows
// it deletes, at any table size; a call that deletes nothing reads a few
// index pages (plus the entries of rows deleted since the last VACUUM).
func (s *Postgres) Purge(ctx context.Context, r PurgeRequest) (int, error) {
	if err := r.validate(); err != nil {
		return 0, err
	}
	now := s.pinned()
	var n int64
	err := s.pipelineSessionPlans(ctx, func(db gen.DBTX) (err error) { n, err = s.sql.purge(ctx, db, now, r); return err })
	if err != nil {
		return 0, fmt.Errorf("leasing: purge %s: %w", s.queue, err)
	}
	if r.IncludeDeadLettered && int(n) < r.BatchSize {
		// Dead letters that hold their keys (strict ordering) are purged
		// with their keys freed and the next messages promoted.
		heads := r
		heads.BatchSize = r.BatchSize - int(n)
		var h int64
		err := s.pipelineSessionPlans(ctx,
			func(db gen.DBTX) (err error) { h, err = s.sql.purgeHeads(ctx, db, now, heads); return err },
			func(db gen.DBTX) error { _, err := s.sql.keyAdvanceVacant(ctx, db, now); return err },
		)
		if err != nil {
			return int(n), fmt.Errorf("leasing: purge %s (after %d deleted): %w", s.queue, n, err)
		}
		n += h
	}
	return int(n), nil
}

// Stats implements Store.Stats with two statements in one round trip.
// Depth counts every row of the table, which costs a scan of the table on
// each call; call it every few seconds at most.
func (s *Postgres) Stats(ctx context.Context) (Stats, error) {
	now := s.pinned()
	var (
		counts map[Status]int64
		health leaseHealth
	)
	var head *WaitingHead
	steps := []func(gen.DBTX) error{
		func(db gen.DBTX) (err error) { counts, err = s.sql.countByStatus(ctx, db); return err },
		func(db gen.DBTX) (err error) { health, err = s.sql.leaseHealth(ctx, db, now); return err },
	}
	orderingHealth := func(db gen.DBTX) (err error) { head, err = s.sql.orderingHealth(ctx, db, now); return err }
	// The ordering keys' table exists from migration 00010 on; on an older
	// schema Stats reports no waiting head.
	checked := !s.skipCheck && s.schemaReady(ctx) == nil
	if checked {
		steps = append(steps, orderingHealth)
	}
	if err := s.pipelineAnySchema(ctx, steps...); err != nil {
		return Stats{}, fmt.Errorf("leasing: stats %s: %w", s.queue, err)
	}
	if s.skipCheck {
		// Unchecked (leasectl doctor): asked on its own, and an undefined
		// table (SQLSTATE 42P01) means a schema before 00010.
		var pgErr *pgconn.PgError
		err := s.pipelineAnySchema(ctx, orderingHealth)
		if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42P01") {
			return Stats{}, fmt.Errorf("leasing: stats %s: %w", s.queue, err)
		}
	}
	st := Stats{
		Queue: s.queue, Depth: emptyDepth(s.queue), ExpiredLeases: health.expiredLeases, OldestDueAge: health.oldestDueAge,
		WaitingHead: head,
	}
	for status, n := range counts {
		st.Depth[status] = n
	}
	return st, nil
}

// Get implements Store.Get.
func (s *Postgres) Get(ctx context.Context, id uuid.UUID) (Row, error) {
	var r Row
	err := s.pipelineSessionPlans(ctx, func(db gen.DBTX) (err error) { r, err = s.sql.get(ctx, db, id); return err })
	if errors.Is(err, ErrNotFound) {
		return Row{}, fmt.Errorf("%w: %s message %s", err, s.queue, id)
	}
	if err != nil {
		return Row{}, fmt.Errorf("leasing: get %s: %w", s.queue, err)
	}
	return r, nil
}

// List returns up to limit rows (1..MaxBatchSize) ordered by (CreatedAt,
// ID), starting after the row with createdAt and id (pass the zero time and
// uuid.Nil for the first page).
//
// Errors: an *ArgumentError for a bad limit; otherwise the driver error.
func (s *Postgres) List(ctx context.Context, createdAt time.Time, id uuid.UUID, limit int) ([]Row, error) {
	if err := validateCount("list limit", limit); err != nil {
		return nil, err
	}
	var rows []Row
	err := s.pipelineSessionPlans(ctx, func(db gen.DBTX) (err error) { rows, err = s.sql.list(ctx, db, createdAt, id, limit); return err })
	if err != nil {
		return nil, fmt.Errorf("leasing: list %s: %w", s.queue, err)
	}
	return rows, nil
}

// fence returns the fenced write's arguments for owner's leases.
func (s *Postgres) fence(owner string, leases []Lease) fenceArgs {
	f := fenceArgs{now: s.pinned(), owner: owner, ids: make([]uuid.UUID, len(leases)), generations: make([]int64, len(leases))}
	for i, l := range leases {
		f.ids[i], f.generations[i] = l.Message.ID, l.Generation
	}
	return f
}

// failArgs returns the fail and dead-letter arguments for owner's failures.
func (s *Postgres) failArgs(owner string, failures []Failure) failArgs {
	leases := make([]Lease, len(failures))
	f := failArgs{
		retryDelays: make([]time.Duration, len(failures)), lastErrors: make([]string, len(failures)),
		attemptErrors: make([]string, len(failures)),
	}
	for i, fl := range failures {
		leases[i], f.retryDelays[i], f.lastErrors[i] = fl.Lease, fl.RetryAfter, SanitizeError(fl.Error)
		f.attemptErrors[i] = attemptError(fl.Error)
	}
	f.fenceArgs = s.fence(owner, leases)
	return f
}
