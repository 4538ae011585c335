package leasing

import (
	"context"
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
