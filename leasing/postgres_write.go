package leasing

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/leasestore/leasestore/gen"
)

// The fenced writes (db/queries/write.sql.tmpl, lease.sql.tmpl) each send
// one statement for the batch, plus the key steps of the keyed messages a
// write may finish, in the hot path's class.

// Renew implements Store.Renew.
func (s *Postgres) Renew(ctx context.Context, leaseFor time.Duration, leases ...Lease) (RenewResult, error) {
	owner, err := validateLeases(s.queue, leases)
	if err == nil {
		err = validateLeaseFor(leaseFor)
	}
	if err != nil {
		return RenewResult{}, err
	}
	f := s.fence(owner, leases)
	renew := bind(s.q.renew, gen.InboxRenewParams{
		MessageIds: idTexts(f.ids), LeaseGenerations: f.generations, LeaseOwner: f.owner, Now: f.now, LeaseFor: leaseFor,
	})
	if err := s.send(ctx, hotPath, renew); err != nil {
		return RenewResult{}, fmt.Errorf("leasing: renew %s: %w", s.queue, err)
	}
	expiry := make(map[uuid.UUID]time.Time, len(renew.out))
	for _, r := range renew.out {
		expiry[r.MessageID] = r.LeaseExpiresAt.UTC()
	}
	return renewResult(leases, expiry), nil
}

// Release implements Store.Release.
func (s *Postgres) Release(ctx context.Context, leases ...Lease) (WriteResult, error) {
	owner, err := validateLeases(s.queue, leases)
	if err != nil {
		return WriteResult{}, err
	}
	f := failArgs{fenceArgs: s.fence(owner, leases), retryDelays: []time.Duration{}, lastErrors: []string{}, attemptErrors: []string{}}
	return s.write(ctx, "release", f.ids, s.release(f), nil)
}

// ReleaseAfter implements Store.ReleaseAfter.
func (s *Postgres) ReleaseAfter(ctx context.Context, failures ...Failure) (WriteResult, error) {
	owner, err := validateFailures(s.queue, failures)
	if err != nil {
		return WriteResult{}, err
	}
	f := s.failArgs(owner, failures)
	return s.write(ctx, "release after", f.ids, s.release(f), nil)
}

// ReleaseOrphans implements Store.ReleaseOrphans.
func (s *Postgres) ReleaseOrphans(ctx context.Context, owner string, held []uuid.UUID) ([]uuid.UUID, error) {
	if err := validateOwner(owner); err != nil {
		return nil, err
	}
	release := bind(s.q.releaseOrphans, gen.InboxReleaseOrphansParams{LeaseOwner: owner, HeldMessageIds: idTexts(held), Now: s.pinned()})
	if err := s.send(ctx, operator, release); err != nil {
		return nil, fmt.Errorf("leasing: release orphans %s: %w", s.queue, err)
	}
	return release.out, nil
}

// Complete implements Store.Complete.
func (s *Postgres) Complete(ctx context.Context, leases ...Lease) (WriteResult, error) {
	owner, err := validateLeases(s.queue, leases)
	if err != nil {
		return WriteResult{}, err
	}
	f := s.fence(owner, leases)
	return s.write(ctx, "complete", f.ids, s.complete(f), leases)
}

// CompleteTx is Complete inside the caller's transaction tx: the
// completion (publication on the outbox) commits or rolls back with tx's
// other writes, so that a handler's effects and its message's completion
// commit together or not at all (the transactional inbox;
// processor.NewTx runs handlers so). Begin tx on the store's pool or any
// connection to the same database. PostgreSQL only: Memory has no
// counterpart.
//
// The statement is Complete's, fenced as Complete is, with tx's settings
// untouched (its isolation level and lock_timeout, as for EnqueueTx). It
// locks the leases' message rows (and, for keyed messages, their keys'
// rows) until tx ends: call it last, just before Commit, so that the
// heartbeat's Renew of these rows waits the shortest time. Each outcome
// holds once tx commits; an outcome other than applied (WriteResult.Err
// says which) means this lease may not finish the message: roll tx back.
// In a REPEATABLE READ or SERIALIZABLE tx a row written by another
// transaction since tx's snapshot fails the call with a serialization
// failure (SQLSTATE 40001).
//
// Errors: an *ArgumentError for a nil tx or bad leases; a *SchemaError
// when the schema is behind the code's; ErrLockTimeout when tx's own
// lock_timeout ran out; otherwise the driver error. After an error tx is
// aborted.
func (s *Postgres) CompleteTx(ctx context.Context, tx pgx.Tx, leases ...Lease) (WriteResult, error) {
	if tx == nil {
		return WriteResult{}, argumentError("tx", "must not be nil")
	}
	owner, err := validateLeases(s.queue, leases)
	if err != nil {
		return WriteResult{}, err
	}
	if err := s.schemaReady(ctx); err != nil {
		return WriteResult{}, err
	}
	f := s.fence(owner, leases)
	w := s.complete(f)
	err = runIn(ctx, tx, w)
	if err == nil {
		keyed := append(keyedIDs(leases), unnamedKeys(w.result(), leases)...)
		err = runIn(ctx, tx, s.keySteps(keyed)...)
	}
	if err != nil {
		return WriteResult{}, fmt.Errorf("leasing: complete %s in the caller's transaction: %w", s.queue, err)
	}
	return WriteResult{Outcomes: outcomes(f.ids, w.result())}, nil
}

// complete returns the Complete (Publish) statement for f.
func (s *Postgres) complete(f fenceArgs) result[[]*gen.InboxCompleteRow] {
	return bind(s.q.complete, gen.InboxCompleteParams{
		LeaseOwner: f.owner, MessageIds: idTexts(f.ids), LeaseGenerations: f.generations, Now: f.now,
	})
}

// release returns the Release statement for f: Release's with empty retry
// delays and errors (due at once, last_error kept), ReleaseAfter's with
// one of each per lease.
func (s *Postgres) release(f failArgs) result[[]*gen.InboxCompleteRow] {
	return bind(s.q.release, gen.InboxReleaseParams{
		MessageIds: idTexts(f.ids), LeaseGenerations: f.generations, RetryDelays: f.retryDelays,
		LastErrors: f.lastErrors, AttemptErrors: f.attemptErrors, Now: f.now, LeaseOwner: f.owner,
	})
}

// fail returns the Fail statement for f.
func (s *Postgres) fail(f failArgs) result[[]*gen.InboxCompleteRow] {
	return bind(s.q.fail, gen.InboxFailParams{
		MessageIds: idTexts(f.ids), LeaseGenerations: f.generations, RetryDelays: f.retryDelays,
		LastErrors: f.lastErrors, AttemptErrors: f.attemptErrors, Now: f.now, LeaseOwner: f.owner,
	})
}

// deadLetter returns the DeadLetter statement for f (its retry delays
// unused).
func (s *Postgres) deadLetter(f failArgs) result[[]*gen.InboxCompleteRow] {
	return bind(s.q.deadLetter, gen.InboxDeadLetterParams{
		MessageIds: idTexts(f.ids), LeaseGenerations: f.generations, LastErrors: f.lastErrors,
		AttemptErrors: f.attemptErrors, Now: f.now, LeaseOwner: f.owner,
	})
}

// Fail implements Store.Fail.
func (s *Postgres) Fail(ctx context.Context, failures ...Failure) (WriteResult, error) {
	owner, err := validateFailures(s.queue, failures)
	if err != nil {
		return WriteResult{}, err
	}
	f := s.failArgs(owner, failures)
	return s.write(ctx, "fail", f.ids, s.fail(f), nil)
}

// DeadLetter implements Store.DeadLetter.
func (s *Postgres) DeadLetter(ctx context.Context, failures ...Failure) (WriteResult, error) {
	owner, err := validateFailures(s.queue, failures)
	if err != nil {
		return WriteResult{}, err
	}
	f := s.failArgs(owner, failures)
	return s.write(ctx, "dead-letter", f.ids, s.deadLetter(f), leasesOf(failures))
}

// write sends one fenced write of ids and wraps its error with op. finishing
// holds the write's leases when it may finish their messages (Complete,
// DeadLetter): the key steps of those that name an ordering key go with
// it, and the keys of those that named none follow (freeUnnamedKeys).
func (s *Postgres) write(ctx context.Context, op string, ids []uuid.UUID, w result[[]*gen.InboxCompleteRow], finishing []Lease) (WriteResult, error) {
	if err := s.send(ctx, hotPath, append([]step{w}, s.keySteps(keyedIDs(finishing))...)...); err != nil {
		return WriteResult{}, fmt.Errorf("leasing: %s %s: %w", op, s.queue, err)
	}
	res := WriteResult{Outcomes: outcomes(ids, w.result())}
	if finishing == nil {
		return res, nil
	}
	return res, s.freeUnnamedKeys(ctx, w.result(), finishing)
}

// fenceArgs are the leases a fenced write names: one owner, and the
// (message id, lease generation) pairs, in the same order.
type fenceArgs struct {
	now         *time.Time
	owner       string
	ids         []uuid.UUID
	generations []int64
}

// failArgs are fenceArgs with each lease's retry delay and error text, as
// last_error keeps it and as the attempt history keeps it.
type failArgs struct {
	fenceArgs
	retryDelays   []time.Duration
	lastErrors    []string
	attemptErrors []string
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
