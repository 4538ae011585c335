package leasing

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/leasestore/leasestore/gen"
)

// PostgresOptions configures a Postgres store. The zero value is the
// production setting.
type PostgresOptions struct {
	// Now, when not nil, pins the clock every statement uses in place of the
	// database's. It exists for tests that must step time without sleeping;
	// production leaves it nil so that the database clock decides.
	Now func() time.Time
	// SkipSchemaCheck turns off the check that the first claim or fenced
	// write runs (see Postgres.CheckSchema), for tools that must work on a
	// database whose schema is behind, such as leasectl doctor.
	SkipSchemaCheck bool
}

// Postgres is the PostgreSQL Store for one queue, over a pgx pool and the
// sqlc queries in db/queries. Each method runs one statement in its own
// transaction (autocommit); EnqueueTx joins the caller's transaction, and
// CompleteAndClaim runs two statements in one.
//
// Claim, CompleteAndClaim, Renew, Release, Complete, Fail and DeadLetter,
// the calls a processor makes for every batch, send their statement in one
// round trip after UseGenericPlans (db/queries/plans.sql): PostgreSQL reuses
// the statement's generic plan instead of planning it again for every call.
// The setting is local to that implicit transaction.
type Postgres struct {
	pool  *pgxpool.Pool
	queue Queue
	sql   queueSQL
	now   func() time.Time

	schemaMu sync.Mutex  // held while the lazy schema check runs
	schemaOK atomic.Bool // the schema check passed, or is skipped
}

var _ Store = (*Postgres)(nil)

// NewPostgres returns the store for queue q over pool. The schema must be
// migrated (db.MigrateUp). NewPostgres sends nothing: the first claim or
// fenced write (any call that goes through the pipeline: Claim,
// CompleteAndClaim, Renew, Release, Complete, Fail, DeadLetter) first runs
// CheckSchema, and fails with its *SchemaError, without running, while the
// schema is behind; call CheckSchema at startup to learn it sooner.
//
// The pool may use any pgx query exec mode, and may go through a
// transaction-mode pooler (PgBouncer, Supavisor, RDS Proxy): no call relies
// on session state between transactions. Behind such a pooler set
// default_query_exec_mode=exec (or cache_describe, or simple_protocol);
// cache_statement and describe_exec need a session of their own.
//
// Errors: an *ArgumentError for a nil pool or an unknown queue.
func NewPostgres(pool *pgxpool.Pool, q Queue, opts PostgresOptions) (*Postgres, error) {
	if pool == nil {
		return nil, argumentError("pool", "must not be nil")
	}
	if _, err := ParseQueue(string(q)); err != nil {
		return nil, err
	}
	s := &Postgres{pool: pool, queue: q, sql: sqlFor(q), now: opts.Now}
	s.schemaOK.Store(opts.SkipSchemaCheck)
	return s, nil
}

// CheckSchema checks, with the package's CheckSchema, that the database
// holds every migration this version of the code needs and every index
// they create on the store's table, present and valid. A database migrated
// further than the code knows passes: during a rolling deploy, older code
// runs on a newer schema, and newer code fails clearly on an older one.
// Once a check passed, the store does not check again (leasectl doctor
// reports an index lost later); a failed check is repeated by the next
// claim or fenced write, so the store recovers once the migration ran.
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
// check at a time.
func (s *Postgres) schemaReady(ctx context.Context) error {
	if s.schemaOK.Load() {
		return nil
	}
	s.schemaMu.Lock()
	defer s.schemaMu.Unlock()
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

// Enqueue implements Store.Enqueue in its own transaction.
func (s *Postgres) Enqueue(ctx context.Context, msgs ...NewMessage) (EnqueueResult, error) {
	return s.enqueue(ctx, s.pool, msgs)
}

// EnqueueTx is Enqueue inside the caller's transaction tx, so that messages
// commit or roll back with the business change that produced them: the
// transactional outbox. One INSERT statement for the whole batch. Begin tx
// on the store's pool or any connection to the same database, e.g. with
// pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { ... }).
//
// Errors: an *ArgumentError for bad messages (nothing sent); ErrDuplicate
// for an outbox id already present (the transaction is then aborted);
// otherwise the driver error.
func (s *Postgres) EnqueueTx(ctx context.Context, tx pgx.Tx, msgs ...NewMessage) (EnqueueResult, error) {
	return s.enqueue(ctx, tx, msgs)
}

func (s *Postgres) enqueue(ctx context.Context, db gen.DBTX, msgs []NewMessage) (EnqueueResult, error) {
	msgs, err := validateMessages(s.queue, msgs)
	if err != nil {
		return EnqueueResult{}, err
	}
	inserted, err := s.sql.enqueue(ctx, db, s.pinned(), msgs)
	if err != nil {
		return EnqueueResult{}, fmt.Errorf("leasing: enqueue %s: %w", s.queue, err)
	}
	return enqueueResult(msgs, inserted), nil
}

// EnqueueCopy bulk-loads msgs with COPY inside the caller's transaction tx:
// the fastest way to add many messages. Rows are due at once (Delay must be
// 0) and get the database clock; a duplicate id or idempotency key fails
// the whole copy. Returns the ids in input order.
//
// Errors: an *ArgumentError for bad messages or a non-zero Delay;
// ErrDuplicate for an id or idempotency key already present; otherwise the
// driver error.
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
	if _, err := s.sql.enqueueCopy(ctx, tx, msgs); err != nil {
		return nil, fmt.Errorf("leasing: copy into %s: %w", s.queue, err)
	}
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
	return leases, parkedError(s.queue, parked)
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
	return s.write(ctx, "release", func(db gen.DBTX) ([]MessageOutcome, error) { return s.sql.release(ctx, db, f) })
}

// ReleaseOrphans implements Store.ReleaseOrphans with one statement.
func (s *Postgres) ReleaseOrphans(ctx context.Context, owner string, held []uuid.UUID) ([]uuid.UUID, error) {
	if err := validateOwner(owner); err != nil {
		return nil, err
	}
	if held == nil {
		held = []uuid.UUID{}
	}
	ids, err := s.sql.releaseOrphans(ctx, s.pool, s.pinned(), owner, held)
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
	return s.write(ctx, "complete", func(db gen.DBTX) ([]MessageOutcome, error) { return s.sql.complete(ctx, db, f) })
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
	err = s.pipeline(ctx,
		func(db gen.DBTX) (err error) { outcomes, err = s.sql.complete(ctx, db, f); return err },
		func(db gen.DBTX) (err error) { leases, parked, err = s.runClaim(ctx, db, r); return err },
	)
	if err != nil {
		return WriteResult{}, nil, fmt.Errorf("leasing: complete and claim %s: %w", s.queue, err)
	}
	return WriteResult{Outcomes: outcomes}, leases, parkedError(s.queue, parked)
}

// Fail implements Store.Fail with one statement for the batch.
func (s *Postgres) Fail(ctx context.Context, failures ...Failure) (WriteResult, error) {
	owner, err := validateFailures(s.queue, failures)
	if err != nil {
		return WriteResult{}, err
	}
	f := s.failArgs(owner, failures)
	return s.write(ctx, "fail", func(db gen.DBTX) ([]MessageOutcome, error) { return s.sql.fail(ctx, db, f) })
}

// DeadLetter implements Store.DeadLetter with one statement for the batch.
func (s *Postgres) DeadLetter(ctx context.Context, failures ...Failure) (WriteResult, error) {
	owner, err := validateFailures(s.queue, failures)
	if err != nil {
		return WriteResult{}, err
	}
	f := s.failArgs(owner, failures)
	return s.write(ctx, "dead-letter", func(db gen.DBTX) ([]MessageOutcome, error) { return s.sql.deadLetter(ctx, db, f) })
}

// write runs one fenced write statement (see pipeline) and wraps its error
// with op and the queue.
func (s *Postgres) write(ctx context.Context, op string, stmt func(gen.DBTX) ([]MessageOutcome, error)) (WriteResult, error) {
	var out []MessageOutcome
	err := s.pipeline(ctx, func(db gen.DBTX) (err error) { out, err = stmt(db); return err })
	if err != nil {
		return WriteResult{}, fmt.Errorf("leasing: %s %s: %w", op, s.queue, err)
	}
	return WriteResult{Outcomes: out}, nil
}

// Requeue implements Store.Requeue.
func (s *Postgres) Requeue(ctx context.Context, ids ...uuid.UUID) (RequeueResult, error) {
	if err := validateIDs(ids); err != nil {
		return RequeueResult{}, err
	}
	requeued, err := s.sql.requeue(ctx, s.pool, s.pinned(), false, ids)
	if err != nil {
		return RequeueResult{}, fmt.Errorf("leasing: requeue %s: %w", s.queue, err)
	}
	return RequeueResult{Requested: len(ids), Requeued: requeued}, nil
}

// RequeueAll implements Store.RequeueAll with one statement.
func (s *Postgres) RequeueAll(ctx context.Context) (RequeueResult, error) {
	requeued, err := s.sql.requeue(ctx, s.pool, s.pinned(), true, []uuid.UUID{})
	if err != nil {
		return RequeueResult{}, fmt.Errorf("leasing: requeue %s: %w", s.queue, err)
	}
	return RequeueResult{Requested: len(requeued), Requeued: requeued}, nil
}

// Purge implements Store.Purge: one DELETE of at most r.BatchSize rows that
// skips rows locked by others, so it never holds long locks.
func (s *Postgres) Purge(ctx context.Context, r PurgeRequest) (int, error) {
	if err := r.validate(); err != nil {
		return 0, err
	}
	n, err := s.sql.purge(ctx, s.pool, s.pinned(), r)
	if err != nil {
		return 0, fmt.Errorf("leasing: purge %s: %w", s.queue, err)
	}
	return int(n), nil
}

// Stats implements Store.Stats. Depth counts every row of the table, which
// costs a scan of the table on each call; call it every few seconds at most.
func (s *Postgres) Stats(ctx context.Context) (Stats, error) {
	counts, err := s.sql.countByStatus(ctx, s.pool)
	if err != nil {
		return Stats{}, fmt.Errorf("leasing: count %s: %w", s.queue, err)
	}
	health, err := s.sql.leaseHealth(ctx, s.pool, s.pinned())
	if err != nil {
		return Stats{}, fmt.Errorf("leasing: lease health %s: %w", s.queue, err)
	}
	st := Stats{Queue: s.queue, Depth: emptyDepth(s.queue), ExpiredLeases: health.expiredLeases, OldestDueAge: health.oldestDueAge}
	for status, n := range counts {
		st.Depth[status] = n
	}
	return st, nil
}

// Get implements Store.Get.
func (s *Postgres) Get(ctx context.Context, id uuid.UUID) (Row, error) {
	r, err := s.sql.get(ctx, s.pool, id)
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
	rows, err := s.sql.list(ctx, s.pool, createdAt, id, limit)
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
	f := failArgs{retryDelays: make([]time.Duration, len(failures)), lastErrors: make([]string, len(failures))}
	for i, fl := range failures {
		leases[i], f.retryDelays[i], f.lastErrors[i] = fl.Lease, fl.RetryAfter, SanitizeError(fl.Error)
	}
	f.fenceArgs = s.fence(owner, leases)
	return f
}
