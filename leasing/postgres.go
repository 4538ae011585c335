package leasing

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
}

var _ Store = (*Postgres)(nil)

// NewPostgres returns the store for queue q over pool. The schema must be
// migrated (db.MigrateUp).
//
// Errors: an *ArgumentError for a nil pool or an unknown queue.
func NewPostgres(pool *pgxpool.Pool, q Queue, opts PostgresOptions) (*Postgres, error) {
	if pool == nil {
		return nil, argumentError("pool", "must not be nil")
	}
	if _, err := ParseQueue(string(q)); err != nil {
		return nil, err
	}
	return &Postgres{pool: pool, queue: q, sql: sqlFor(q), now: opts.Now}, nil
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
	return s.EnqueueTx(ctx, s.pool, msgs...)
}

// EnqueueTx is Enqueue inside the caller's transaction (pass a pgx.Tx), so
// that messages commit or roll back with the business change that produced
// them: the transactional outbox. One INSERT statement for the whole batch.
//
// Errors: an *ArgumentError for bad messages (nothing sent); otherwise the
// driver error, e.g. a unique violation for an outbox id already present.
func (s *Postgres) EnqueueTx(ctx context.Context, tx gen.DBTX, msgs ...NewMessage) (EnqueueResult, error) {
	msgs, err := validateMessages(s.queue, msgs)
	if err != nil {
		return EnqueueResult{}, err
	}
	inserted, err := s.sql.enqueue(ctx, tx, s.pinned(), msgs)
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return EnqueueResult{}, fmt.Errorf("leasing: enqueue %s: %w: %s", s.queue, ErrDuplicate, pgErr.Detail)
	}
	if err != nil {
		return EnqueueResult{}, fmt.Errorf("leasing: enqueue %s: %w", s.queue, err)
	}
	return enqueueResult(msgs, inserted), nil
}

// EnqueueCopy bulk-loads msgs with COPY inside tx (a pgx.Tx or the pool):
// the fastest way to add many messages. Rows are due at once (Delay must be
// 0) and get the database clock; a duplicate id or idempotency key fails
// the whole copy. Returns the ids in input order.
//
// Errors: an *ArgumentError for bad messages or a non-zero Delay; otherwise
// the driver error.
func (s *Postgres) EnqueueCopy(ctx context.Context, tx gen.DBTX, msgs ...NewMessage) ([]uuid.UUID, error) {
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
func (s *Postgres) Claim(ctx context.Context, r ClaimRequest) ([]Lease, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	var rows []gen.InboxClaimRow
	err := s.pipeline(ctx, func(db gen.DBTX) (err error) { rows, err = s.runClaim(ctx, db, r); return err })
	if err != nil {
		return nil, fmt.Errorf("leasing: claim %s: %w", s.queue, err)
	}
	return s.leasesOf(rows), nil
}

// runClaim sends the claim statement for r on db: the tenant's claim when
// r names a tenant, else the untenanted one. Claim and ExplainClaim both use it.
func (s *Postgres) runClaim(ctx context.Context, db gen.DBTX, r ClaimRequest) ([]gen.InboxClaimRow, error) {
	if r.TenantID != "" {
		return s.sql.claimTenant(ctx, db, gen.InboxClaimTenantParams{
			Now: s.pinned(), TenantID: r.TenantID, BatchSize: int32(r.BatchSize), LeaseOwner: r.Owner, LeaseFor: r.LeaseFor,
		})
	}
	return s.sql.claim(ctx, db, gen.InboxClaimParams{
		Now: s.pinned(), BatchSize: int32(r.BatchSize), LeaseOwner: r.Owner, LeaseFor: r.LeaseFor,
	})
}

// leasesOf converts claimed rows to leases, in the rows' order.
func (s *Postgres) leasesOf(rows []gen.InboxClaimRow) []Lease {
	leases := make([]Lease, len(rows))
	for i, row := range rows {
		leases[i] = s.leaseOf(row)
	}
	return leases
}

func (s *Postgres) leaseOf(r gen.InboxClaimRow) Lease {
	return Lease{
		Queue:      s.queue,
		Owner:      r.LeaseOwner,
		Generation: r.LeaseGeneration,
		ExpiresAt:  r.LeaseExpiresAt.UTC(),
		Attempt:    int(r.AttemptCount),
		LastError:  deref(r.LastError),
		Message: Message{
			ID: r.MessageID, Type: r.MessageType, Payload: r.Payload, Headers: r.Headers,
			TenantID: deref(r.TenantID), IdempotencyKey: deref(r.IdempotencyKey), Topic: r.Topic,
			CreatedAt: r.CreatedAt.UTC(), VisibleAfter: r.VisibleAfter.UTC(),
		},
	}
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
	ids, gens := fence(leases)
	params := gen.InboxRenewParams{MessageIds: ids, LeaseGenerations: gens, LeaseOwner: owner, Now: s.pinned(), LeaseFor: leaseFor}
	var rows []gen.InboxRenewRow
	err = s.pipeline(ctx, func(db gen.DBTX) (err error) { rows, err = s.sql.renew(ctx, db, params); return err })
	if err != nil {
		return RenewResult{}, fmt.Errorf("leasing: renew %s: %w", s.queue, err)
	}
	expiry := make(map[uuid.UUID]time.Time, len(rows))
	for _, r := range rows {
		expiry[r.MessageID] = r.LeaseExpiresAt.UTC()
	}
	return renewResult(leases, expiry), nil
}

// Release implements Store.Release with one statement for the batch.
func (s *Postgres) Release(ctx context.Context, leases ...Lease) (WriteResult, error) {
	owner, err := validateLeases(s.queue, leases)
	if err != nil {
		return WriteResult{}, err
	}
	ids, gens := fence(leases)
	params := gen.InboxReleaseParams{MessageIds: ids, LeaseGenerations: gens, Now: s.pinned(), LeaseOwner: owner}
	return s.write(ctx, "release", func(db gen.DBTX) ([]MessageOutcome, error) { return s.sql.release(ctx, db, params) })
}

// ReleaseOrphans implements Store.ReleaseOrphans with one statement.
func (s *Postgres) ReleaseOrphans(ctx context.Context, owner string, held []uuid.UUID) ([]uuid.UUID, error) {
	if err := validateOwner(owner); err != nil {
		return nil, err
	}
	if held == nil {
		held = []uuid.UUID{}
	}
	ids, err := s.sql.orphans(ctx, s.pool, gen.InboxReleaseOrphansParams{LeaseOwner: owner, HeldMessageIds: held, Now: s.pinned()})
	if err != nil {
		return nil, fmt.Errorf("leasing: release orphans %s: %w", s.queue, err)
	}
	return ids, nil
}

// Complete implements Store.Complete with one statement for the batch.
func (s *Postgres) Complete(ctx context.Context, leases ...Lease) (WriteResult, error) {
	params, err := s.completeParams(leases)
	if err != nil {
		return WriteResult{}, err
	}
	return s.write(ctx, "complete", func(db gen.DBTX) ([]MessageOutcome, error) { return s.sql.complete(ctx, db, params) })
}

// completeParams validates leases and returns the complete statement's
// parameters for them.
func (s *Postgres) completeParams(leases []Lease) (gen.InboxCompleteParams, error) {
	owner, err := validateLeases(s.queue, leases)
	if err != nil {
		return gen.InboxCompleteParams{}, err
	}
	ids, gens := fence(leases)
	return gen.InboxCompleteParams{LeaseOwner: owner, MessageIds: ids, LeaseGenerations: gens, Now: s.pinned()}, nil
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
	params, err := s.completeParams(done)
	if err == nil {
		err = r.Validate()
	}
	if err != nil {
		return WriteResult{}, nil, err
	}
	var (
		outcomes []MessageOutcome
		rows     []gen.InboxClaimRow
	)
	err = s.pipeline(ctx,
		func(db gen.DBTX) (err error) { outcomes, err = s.sql.complete(ctx, db, params); return err },
		func(db gen.DBTX) (err error) { rows, err = s.runClaim(ctx, db, r); return err },
	)
	if err != nil {
		return WriteResult{}, nil, fmt.Errorf("leasing: complete and claim %s: %w", s.queue, err)
	}
	return WriteResult{Outcomes: outcomes}, s.leasesOf(rows), nil
}

// Fail implements Store.Fail with one statement for the batch.
func (s *Postgres) Fail(ctx context.Context, failures ...Failure) (WriteResult, error) {
	owner, err := validateFailures(s.queue, failures)
	if err != nil {
		return WriteResult{}, err
	}
	ids, gens, delays, texts := failureColumns(failures)
	params := gen.InboxFailParams{
		LeaseOwner: owner, MessageIds: ids, LeaseGenerations: gens, RetryDelays: delays,
		LastErrors: texts, Now: s.pinned(),
	}
	return s.write(ctx, "fail", func(db gen.DBTX) ([]MessageOutcome, error) { return s.sql.fail(ctx, db, params) })
}

// DeadLetter implements Store.DeadLetter with one statement for the batch.
func (s *Postgres) DeadLetter(ctx context.Context, failures ...Failure) (WriteResult, error) {
	owner, err := validateFailures(s.queue, failures)
	if err != nil {
		return WriteResult{}, err
	}
	ids, gens, _, texts := failureColumns(failures)
	params := gen.InboxDeadLetterParams{LeaseOwner: owner, MessageIds: ids, LeaseGenerations: gens, LastErrors: texts, Now: s.pinned()}
	return s.write(ctx, "dead-letter", func(db gen.DBTX) ([]MessageOutcome, error) { return s.sql.deadLetter(ctx, db, params) })
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
	requeued, err := s.sql.requeue(ctx, s.pool, gen.InboxRequeueParams{Now: s.pinned(), MessageIds: ids})
	if err != nil {
		return RequeueResult{}, fmt.Errorf("leasing: requeue %s: %w", s.queue, err)
	}
	return RequeueResult{Requested: len(ids), Requeued: requeued}, nil
}

// RequeueAll implements Store.RequeueAll with one statement.
func (s *Postgres) RequeueAll(ctx context.Context) (RequeueResult, error) {
	requeued, err := s.sql.requeue(ctx, s.pool, gen.InboxRequeueParams{
		Now: s.pinned(), RequeueAll: true, MessageIds: []uuid.UUID{},
	})
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
	n, err := s.sql.purge(ctx, s.pool, gen.InboxPurgeParams{
		Now: s.pinned(), OlderThan: r.OlderThan, IncludeDeadLettered: r.IncludeDeadLettered,
		BatchSize: int32(r.BatchSize),
	})
	if err != nil {
		return 0, fmt.Errorf("leasing: purge %s: %w", s.queue, err)
	}
	return int(n), nil
}

// Stats implements Store.Stats. Depth counts every row of the table, which
// costs a scan of the table on each call; call it every few seconds at most.
func (s *Postgres) Stats(ctx context.Context) (Stats, error) {
	counts, err := s.sql.counts(ctx, s.pool)
	if err != nil {
		return Stats{}, fmt.Errorf("leasing: count %s: %w", s.queue, err)
	}
	health, err := s.sql.health(ctx, s.pool, gen.InboxLeaseHealthParams{Now: s.pinned()})
	if err != nil {
		return Stats{}, fmt.Errorf("leasing: lease health %s: %w", s.queue, err)
	}
	st := Stats{Queue: s.queue, Depth: emptyDepth(s.queue), ExpiredLeases: health.ExpiredLeases, OldestDueAge: health.OldestDueAge}
	for _, c := range counts {
		st.Depth[Status(c.Status)] = c.Messages
	}
	return st, nil
}

// Get implements Store.Get.
func (s *Postgres) Get(ctx context.Context, id uuid.UUID) (Row, error) {
	r, err := s.sql.get(ctx, s.pool, gen.InboxGetParams{MessageID: id})
	if errors.Is(err, pgx.ErrNoRows) {
		return Row{}, fmt.Errorf("%w: %s message %s", ErrNotFound, s.queue, id)
	}
	if err != nil {
		return Row{}, fmt.Errorf("leasing: get %s: %w", s.queue, err)
	}
	return rowOf(r), nil
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
	rows, err := s.sql.list(ctx, s.pool, gen.InboxListParams{AfterCreatedAt: createdAt, AfterMessageID: id, MaxRows: int32(limit)})
	if err != nil {
		return nil, fmt.Errorf("leasing: list %s: %w", s.queue, err)
	}
	out := make([]Row, len(rows))
	for i, r := range rows {
		out[i] = rowOf(r)
	}
	return out, nil
}

func rowOf(r gen.InboxGetRow) Row {
	return Row{
		Message: Message{
			ID: r.MessageID, Type: r.MessageType, Payload: r.Payload, Headers: r.Headers,
			TenantID: deref(r.TenantID), IdempotencyKey: deref(r.IdempotencyKey), Topic: r.Topic,
			CreatedAt: r.CreatedAt.UTC(), VisibleAfter: r.VisibleAfter.UTC(),
		},
		Status:            Status(r.Status),
		LeaseOwner:        deref(r.LeaseOwner),
		LeaseExpiresAt:    utc(r.LeaseExpiresAt),
		LeaseGeneration:   r.LeaseGeneration,
		OutcomeGeneration: r.OutcomeGeneration,
		Outcome:           deref(r.Outcome),
		AttemptCount:      int(r.AttemptCount),
		LastAttemptedAt:   utc(r.LastAttemptedAt),
		LastError:         deref(r.LastError),
		FinishedAt:        utc(r.FinishedAt),
		DeadLetteredAt:    utc(r.DeadLetteredAt),
	}
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// fence returns the (message id, generation) columns of leases.
func fence(leases []Lease) ([]uuid.UUID, []int64) {
	ids := make([]uuid.UUID, len(leases))
	gens := make([]int64, len(leases))
	for i, l := range leases {
		ids[i], gens[i] = l.Message.ID, l.Generation
	}
	return ids, gens
}

func failureColumns(failures []Failure) ([]uuid.UUID, []int64, []time.Duration, []string) {
	leases := make([]Lease, len(failures))
	delays := make([]time.Duration, len(failures))
	texts := make([]string, len(failures))
	for i, f := range failures {
		leases[i], delays[i], texts[i] = f.Lease, f.RetryAfter, SanitizeError(f.Error)
	}
	ids, gens := fence(leases)
	return ids, gens, delays, texts
}

// enqueueResult reports msgs against the ids the store inserted.
func enqueueResult(msgs []NewMessage, inserted []uuid.UUID) EnqueueResult {
	done := make(map[uuid.UUID]bool, len(inserted))
	for _, id := range inserted {
		done[id] = true
	}
	res := EnqueueResult{IDs: make([]uuid.UUID, len(msgs)), Duplicates: []uuid.UUID{}}
	for i, m := range msgs {
		res.IDs[i] = m.ID
		if !done[m.ID] {
			res.Duplicates = append(res.Duplicates, m.ID)
		}
	}
	return res
}

// renewResult splits leases into renewed (with new expiry) and lost.
func renewResult(leases []Lease, expiry map[uuid.UUID]time.Time) RenewResult {
	res := RenewResult{Renewed: []Lease{}, Lost: []uuid.UUID{}}
	for _, l := range leases {
		if t, ok := expiry[l.Message.ID]; ok {
			l.ExpiresAt = t
			res.Renewed = append(res.Renewed, l)
		} else {
			res.Lost = append(res.Lost, l.Message.ID)
		}
	}
	return res
}
