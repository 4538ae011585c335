package leasing

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Store is the lease store contract that Postgres and Memory implement and
// leasingtest checks. A Store serves one Queue and is safe for concurrent use.
//
// Batch methods take 1..MaxBatchSize items and validate all of them before
// any statement runs: on bad input they return an *ArgumentError and change
// nothing. Per-message results come back in input order. Other errors are
// the driver's (connection, context); a call whose reply was lost may have
// committed (each method's Errors paragraph says what then holds). A
// Postgres call whose statements the database refuses to the store's role
// returns an error matching ErrPermissionDenied (VacuumIfDead checks first
// and returns ErrVacuumNotAllowed; a claim that parked rows reports a
// refused freeing of their keys in ParkedError.KeysNotFreed).
type Store interface {
	// Queue returns the queue this store serves.
	//
	// Errors: none; it sends nothing.
	Queue() Queue

	// Enqueue adds messages, due after their Delay from the store's now, in
	// slice order (their CreatedAt increases in that order). Inbox messages
	// whose ID or (TenantID, IdempotencyKey) is already present are skipped
	// and reported as duplicates.
	//
	// Errors: an *ArgumentError for bad messages (nothing sent);
	// ErrDuplicate for an outbox id already present and an
	// *OrderingKeyConflictError for a keyed inbox message whose duplicate
	// carries another ordering key or none, with nothing inserted (an
	// unkeyed duplicate is skipped whatever the stored key); Postgres also returns ErrLockTimeout past
	// PostgresOptions.LockTimeout, and a *SchemaError (errors.Is ErrSchema)
	// for keyed messages while the schema is behind (unkeyed ones work on an
	// older schema). Otherwise the context's or the driver's error.
	Enqueue(ctx context.Context, msgs ...NewMessage) (EnqueueResult, error)

	// Claim leases up to r.BatchSize due messages to r.Owner for r.LeaseFor.
	// Due are pending and failed rows whose VisibleAfter has passed and in-flight
	// rows whose lease has expired. Returns 0..BatchSize leases ordered by
	// (CreatedAt, ID), never nil. Each claim bumps the generation and attempt.
	//
	// A due row that cannot be leased (a counter at its type's limit, a
	// non-finite time, headers that are not a JSON object: see
	// ParkedError) is parked instead: dead-lettered by the claim with the
	// reason as its last error, counted against BatchSize. Claim then
	// returns the leases it took and a *ParkedError (errors.Is ErrParked)
	// naming the parked rows; the leases are valid, work them as usual.
	// One bad row never fails the claim of the others.
	//
	// Errors: an *ArgumentError for a bad r (ClaimRequest.Validate; nothing
	// sent); a *ParkedError beside the leases, as above; Postgres also
	// returns a *SchemaError (errors.Is ErrSchema) while the schema is
	// behind this version and ErrLockTimeout past PostgresOptions.LockTimeout,
	// with nothing claimed. Otherwise the context's or the driver's error:
	// when it came while the reply was read, the claim may have committed,
	// and its leases expire unless ReleaseOrphans returns them.
	Claim(ctx context.Context, r ClaimRequest) ([]Lease, error)

	// Renew extends each lease to the store's now + leaseFor while its owner,
	// generation and in-flight status still match and it has not expired.
	// A lease that cannot be renewed is reported in RenewResult.Lost, not as
	// an error.
	//
	// Errors: an *ArgumentError for leaseFor outside 1µs..MaxLeaseDuration
	// or bad leases (none or more than MaxBatchSize, another queue's, more
	// than one owner, an owner that is empty, over MaxOwnerBytes, not UTF-8
	// or holds NUL, one message twice, a generation below 1; nothing
	// sent); Postgres also returns a *SchemaError (errors.Is ErrSchema)
	// while the schema is behind and ErrLockTimeout past
	// PostgresOptions.LockTimeout, with nothing renewed. Otherwise the
	// context's or the driver's error.
	Renew(ctx context.Context, leaseFor time.Duration, leases ...Lease) (RenewResult, error)

	// Release gives leases back early: the row is pending and due at once,
	// its lease owner and expiry are cleared and the attempt the claim counted
	// is returned. The generation stays, so the released lease is fenced.
	// Leases that were lost, or messages terminal or gone, are outcomes in
	// the WriteResult (WriteResult.Err), not errors.
	//
	// Errors: an *ArgumentError for bad leases, as for Renew (nothing sent);
	// Postgres also returns a *SchemaError (errors.Is ErrSchema) while the
	// schema is behind and ErrLockTimeout past PostgresOptions.LockTimeout,
	// with nothing released. Otherwise the context's or the driver's error;
	// when it came while the reply was read, the release may have committed,
	// and a retry reports already_applied.
	Release(ctx context.Context, leases ...Lease) (WriteResult, error)

	// ReleaseOrphans releases, as Release does, every in-flight row leased
	// to owner whose lease has not expired by the store's now and whose id
	// is not in held: leases that a claim took for owner but whose reply
	// never reached it (the call failed or timed out after the claim
	// committed). An expired lease is left alone, to be reclaimed with its
	// attempt counted: owner may have held it, run its handler, lost it
	// and forgotten it. Only the process that owns the owner name may call
	// it, and never while one of its claims is running. Returns the
	// released ids ordered by id.
	//
	// Errors: an *ArgumentError for a bad owner (nothing sent); Postgres
	// also returns a *SchemaError (errors.Is ErrSchema) while the schema is
	// behind and ErrLockTimeout past PostgresOptions.LockTimeout. Otherwise
	// the context's or the driver's error.
	ReleaseOrphans(ctx context.Context, owner string, held []uuid.UUID) ([]uuid.UUID, error)

	// Complete writes the queue's success state (completed or published).
	// Leases that were lost, or messages terminal or gone, are outcomes in
	// the WriteResult (WriteResult.Err), not errors.
	//
	// Errors: an *ArgumentError for bad leases, as for Renew (nothing sent);
	// Postgres also returns a *SchemaError (errors.Is ErrSchema) while the
	// schema is behind and ErrLockTimeout past PostgresOptions.LockTimeout,
	// with nothing written. Otherwise the context's or the driver's error;
	// when it came while the reply was read, the write may have committed,
	// and a retry reports already_applied.
	Complete(ctx context.Context, leases ...Lease) (WriteResult, error)

	// Fail writes failed: the message is due again RetryAfter from the
	// store's now, with Error as its last error (sanitized, never refused:
	// see Failure.Error). Leases that were lost, or messages terminal or
	// gone, are outcomes in the WriteResult (WriteResult.Err), not errors.
	//
	// Errors: an *ArgumentError for a RetryAfter outside 0..MaxDelay or bad
	// leases, as for Renew (nothing sent); Postgres also returns a
	// *SchemaError (errors.Is ErrSchema) while the schema is behind and
	// ErrLockTimeout past PostgresOptions.LockTimeout, with nothing
	// written. Otherwise the context's or the driver's error; when it came
	// while the reply was read, the write may have committed, and a retry
	// reports already_applied.
	Fail(ctx context.Context, failures ...Failure) (WriteResult, error)

	// DeadLetter writes dead_lettered with Error as the last error
	// (sanitized, as for Fail). RetryAfter is not used, but it is checked.
	//
	// Errors: as for Fail, RetryAfter's check included.
	DeadLetter(ctx context.Context, failures ...Failure) (WriteResult, error)

	// Requeue moves the given dead-lettered messages back to pending, due at
	// once, with the attempt count 0 and lease owner and last error cleared
	// (Row.Attempts, the history, is kept, with a requeued entry); other ids
	// are left alone. Requeue with no ids is an argument error: use RequeueAll.
	// An id left alone (not dead-lettered, or not in the queue) is only
	// missing from RequeueResult.Requeued, not an error.
	//
	// Errors: an *ArgumentError for no ids, more than MaxBatchSize, an id
	// twice or the nil UUID (nothing sent); Postgres also returns a
	// *SchemaError (errors.Is ErrSchema) while the schema is behind and
	// ErrLockTimeout past PostgresOptions.LockTimeout, with nothing
	// requeued. Otherwise the context's or the driver's error.
	Requeue(ctx context.Context, ids ...uuid.UUID) (RequeueResult, error)

	// RequeueAll does Requeue for every message of the queue dead-lettered
	// when the call starts, in bounded batches (Postgres: at most
	// MaxBatchSize rows per statement, each batch its own transaction). It
	// is not atomic across batches: when it returns an error, the batches
	// before it stay requeued, and calling it again requeues the rest. A
	// message dead-lettered again after its requeue, while the call runs,
	// is left for the next call.
	//
	// Errors: Postgres returns a *SchemaError (errors.Is ErrSchema) while
	// the schema is behind and ErrLockTimeout past
	// PostgresOptions.LockTimeout; otherwise the context's or the driver's
	// error. After an error the batches before stay requeued, as above.
	RequeueAll(ctx context.Context) (RequeueResult, error)

	// Purge deletes up to r.BatchSize terminal messages finished more than
	// r.OlderThan ago (by completion, publication or dead-letter time, never
	// creation time) and returns how many it deleted. Active rows are never
	// touched. Call it until it returns fewer than r.BatchSize.
	//
	// Errors: an *ArgumentError for r.OlderThan <= 0 or r.BatchSize outside
	// 1..MaxBatchSize (nothing sent); Postgres also returns a *SchemaError
	// (errors.Is ErrSchema) while the schema is behind and ErrLockTimeout
	// past PostgresOptions.LockTimeout. Otherwise the context's or the
	// driver's error. With r.IncludeDeadLettered, Postgres deletes the dead
	// letters that hold their ordering keys in a second transaction: when
	// that one fails, Purge returns the count the first deleted beside the
	// error.
	Purge(ctx context.Context, r PurgeRequest) (int, error)

	// Stats returns queue depth by status and lease health at the store's now.
	//
	// Errors: the context's or the driver's error; Postgres also returns
	// ErrLockTimeout past PostgresOptions.LockTimeout. Never a *SchemaError:
	// Stats works on a schema older than this version's (with no
	// WaitingHead before the ordering keys' migration).
	Stats(ctx context.Context) (Stats, error)

	// Get returns one message's stored state.
	//
	// Errors: ErrNotFound when the queue holds no such id; Postgres also
	// returns a *SchemaError (errors.Is ErrSchema) while the schema is
	// behind and ErrLockTimeout past PostgresOptions.LockTimeout. Otherwise
	// the context's or the driver's error.
	Get(ctx context.Context, id uuid.UUID) (Row, error)
}

// EnqueueResult reports an Enqueue call.
type EnqueueResult struct {
	// IDs holds every input message's id, in input order.
	IDs []uuid.UUID
	// Duplicates holds the ids skipped as already present (inbox only), in
	// input order; empty when all were inserted.
	Duplicates []uuid.UUID
}

// Outcome says what a guarded write did to one message.
type Outcome string

const (
	// OutcomeApplied: the write changed the row.
	OutcomeApplied Outcome = "applied"
	// OutcomeAlreadyApplied: this same lease (owner and generation) had
	// already written this same outcome (a retry after an unknown commit);
	// nothing changed. The row's attempt history (Row.Attempts) decides it,
	// so a retry says so even after later leases wrote, as long as the
	// lease's entry is among the last AttemptHistoryLimit.
	OutcomeAlreadyApplied Outcome = "already_applied"
	// OutcomeTerminal: the row is completed, published or dead-lettered
	// under another lease; nothing changed.
	OutcomeTerminal Outcome = "terminal"
	// OutcomeLost: the lease expired and was reclaimed, or was released; the
	// row belongs to someone else and nothing changed.
	OutcomeLost Outcome = "lost"
	// OutcomeNotFound: no row has this message id.
	OutcomeNotFound Outcome = "not_found"
)

// Succeeded reports whether the row now holds the state the write asked for
// (applied, or already applied by this lease).
func (o Outcome) Succeeded() bool { return o == OutcomeApplied || o == OutcomeAlreadyApplied }

// MessageOutcome is one message's outcome in a WriteResult.
type MessageOutcome struct {
	// MessageID is the message written.
	MessageID uuid.UUID
	// Outcome is what the write did.
	Outcome Outcome
}

// WriteResult reports a guarded batch write, one entry per input in order.
type WriteResult struct {
	// Outcomes holds one entry per input lease, in input order.
	Outcomes []MessageOutcome
}

// Count returns how many messages ended with outcome o.
func (r WriteResult) Count(o Outcome) int {
	n := 0
	for _, m := range r.Outcomes {
		if m.Outcome == o {
			n++
		}
	}
	return n
}

// Err returns nil when every write succeeded (applied or already applied);
// otherwise an error naming the first failed message that matches
// ErrLeaseLost, ErrAlreadyTerminal or ErrNotFound with errors.Is.
func (r WriteResult) Err() error {
	for _, m := range r.Outcomes {
		switch m.Outcome {
		case OutcomeLost:
			return fmt.Errorf("%w: message %s", ErrLeaseLost, m.MessageID)
		case OutcomeTerminal:
			return fmt.Errorf("%w: message %s", ErrAlreadyTerminal, m.MessageID)
		case OutcomeNotFound:
			return fmt.Errorf("%w: message %s", ErrNotFound, m.MessageID)
		}
	}
	return nil
}

// RenewResult reports a Renew call.
type RenewResult struct {
	// Renewed holds the renewed leases with their new ExpiresAt, in input order.
	Renewed []Lease
	// Lost holds the ids of messages whose lease could not be renewed, in
	// input order: expired, reclaimed, released or finished.
	Lost []uuid.UUID
}

// Err returns nil when every lease was renewed, else an error matching
// ErrLeaseLost that names the first lost message.
func (r RenewResult) Err() error {
	if len(r.Lost) > 0 {
		return fmt.Errorf("%w: message %s", ErrLeaseLost, r.Lost[0])
	}
	return nil
}

// RequeueResult reports a Requeue or RequeueAll call.
type RequeueResult struct {
	// Requested is the number of ids asked for (for RequeueAll, the number of
	// dead-lettered rows found, which is len(Requeued)).
	Requested int
	// Requeued holds the ids moved back to pending, ordered by id.
	Requeued []uuid.UUID
}

// PurgeRequest selects terminal rows to delete.
type PurgeRequest struct {
	// OlderThan is the minimum age of the finish time, > 0.
	OlderThan time.Duration
	// BatchSize is the most rows one call deletes, 1..MaxBatchSize.
	BatchSize int
	// IncludeDeadLettered also deletes dead-lettered rows by their
	// dead-letter time; by default they are kept for requeue.
	IncludeDeadLettered bool
}

func (r PurgeRequest) validate() error {
	if err := ValidatePositive("older than", r.OlderThan); err != nil {
		return err
	}
	return validateCount("purge batch", r.BatchSize)
}

// Stats is a queue's depth and lease health at one instant of the store clock.
type Stats struct {
	// Queue is the queue described.
	Queue Queue
	// Depth holds the number of rows per status, every status of the queue
	// present (0 when none).
	Depth map[Status]int64
	// ExpiredLeases is the number of in-flight rows whose lease has expired
	// and that no claim has taken over yet.
	ExpiredLeases int64
	// OldestDueAge is how long the oldest due row has existed (store now
	// minus its CreatedAt); 0 when nothing is due.
	OldestDueAge time.Duration
	// WaitingHead is the ordering key whose head has held it longest while
	// messages wait behind it (Depth[StatusWaiting] counts those), with
	// how long; nil when no message waits.
	WaitingHead *WaitingHead
}

// OldestHeadAge is the age of the oldest head that messages wait behind
// (WaitingHead.Age), 0 when none waits.
func (s Stats) OldestHeadAge() time.Duration {
	if s.WaitingHead == nil {
		return 0
	}
	return s.WaitingHead.Age
}

func emptyDepth(q Queue) map[Status]int64 {
	depth := make(map[Status]int64, 6)
	for _, s := range q.Statuses() {
		depth[s] = 0
	}
	return depth
}
