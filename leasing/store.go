package leasing

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// Store is the lease store that Postgres and Memory implement and
// leasingtest checks. A Store serves one Queue and is safe for concurrent
// use. Times follow the store's clock (the database's for Postgres), never
// the caller's, to the microsecond. Results come back in input order.
//
// Lease arguments: 1..MaxBatchSize leases of this queue, one owner (a valid
// owner: see ClaimRequest.Owner), no message twice, generations from Claim.
// A lease that was lost, or a message terminal or gone, is not an error: it
// is an Outcome in the WriteResult (WriteResult.Err makes it one) or an id
// in RenewResult.Lost. A method does not keep its slice arguments once it
// returns: the caller may reuse them (the processor reuses its write
// arguments). A slice a method returns (Claim's leases) is the caller's:
// the store keeps no reference to it, and the caller may change it (the
// processor keeps a claim's leases in it until their outcomes are
// written).
//
// Errors, for every method but Queue:
//   - an *ArgumentError (errors.Is ErrInvalidArgument) for bad input, found
//     before any statement runs, with nothing changed;
//   - the context's error, or the driver's;
//   - Postgres only, with nothing changed: a *SchemaError (errors.Is
//     ErrSchema) while the schema is behind this version, ErrLockTimeout
//     past PostgresOptions.LockTimeout, and an error matching
//     ErrPermissionDenied for a statement the database refuses the role;
//   - Postgres only, transient: an error matching ErrUnavailable while no
//     writable primary answers (a failover); it may have committed only
//     when the connection broke after the call was sent.
//
// A call whose reply was lost may have committed: a retried write then
// reports OutcomeAlreadyApplied, and a lost claim's leases expire unless
// ReleaseOrphans returns them. A method documents only its own errors.
type Store interface {
	// Queue returns the queue this store serves; it sends nothing.
	Queue() Queue

	// Enqueue adds msgs, each due Delay after the store's now, in slice
	// order (their CreatedAt increases in that order). Inbox messages whose
	// ID or (TenantID, IdempotencyKey) is already present are skipped and
	// reported in EnqueueResult.Duplicates.
	//
	// Errors: ErrDuplicate for an outbox id already present, and an
	// *OrderingKeyConflictError for a keyed inbox message whose duplicate
	// carries another ordering key or none; both insert nothing. Postgres
	// returns a *SchemaError for keyed messages only: unkeyed ones work on
	// an older schema.
	Enqueue(ctx context.Context, msgs ...NewMessage) (EnqueueResult, error)

	// Claim leases up to r.BatchSize due messages to r.Owner for r.LeaseFor:
	// pending and failed rows whose VisibleAfter has passed, and in-flight
	// rows whose lease has expired. Each claim bumps the generation and the
	// attempt. Returns 0..BatchSize leases ordered by (CreatedAt, ID), never
	// nil.
	//
	// Errors: a *ParkedError beside the leases when the claim parked rows
	// it could not lease; the leases are valid.
	Claim(ctx context.Context, r ClaimRequest) ([]Lease, error)

	// Renew extends each lease to the store's now + leaseFor
	// (1µs..MaxLeaseDuration) while its owner, generation and in-flight
	// status still match and it has not expired.
	Renew(ctx context.Context, leaseFor time.Duration, leases ...Lease) (RenewResult, error)

	// Release gives leases back early: the row is pending and due at once,
	// its lease owner and expiry are cleared and the attempt the claim
	// counted is returned. The generation stays, so the lease is fenced.
	Release(ctx context.Context, leases ...Lease) (WriteResult, error)

	// ReleaseAfter releases each failure's lease as Release does (pending,
	// attempt returned, lease owner and expiry cleared, generation kept),
	// but the message is due RetryAfter (0..MaxDelay) after the store's now
	// and Error is its last error (sanitized as for Fail) and its attempt
	// entry's. It is the write of an attempt that failed without spending
	// the attempt: the destination asked to wait, or was unavailable. A
	// keyed head stays its key's head. Outcomes as for Release; a retried
	// ReleaseAfter or Release of the same lease reports
	// OutcomeAlreadyApplied.
	ReleaseAfter(ctx context.Context, failures ...Failure) (WriteResult, error)

	// ReleaseOrphans releases, as Release does, every unexpired lease of
	// owner not in held: those of claims whose reply never reached owner.
	// An expired lease is left to be reclaimed with its attempt counted
	// (owner may have worked it). Only owner's process may call it, never
	// while one of its claims runs. Returns the ids ordered by id.
	ReleaseOrphans(ctx context.Context, owner string, held []uuid.UUID) ([]uuid.UUID, error)

	// Complete writes the queue's success state (completed or published).
	Complete(ctx context.Context, leases ...Lease) (WriteResult, error)

	// Fail writes failed: the message is due again RetryAfter (0..MaxDelay)
	// after the store's now, with Error as its last error (sanitized, never
	// refused: see Failure.Error).
	Fail(ctx context.Context, failures ...Failure) (WriteResult, error)

	// DeadLetter writes dead_lettered with Error as the last error, as Fail
	// does. RetryAfter is not used, but it is checked.
	DeadLetter(ctx context.Context, failures ...Failure) (WriteResult, error)

	// Requeue moves the given dead-lettered messages back to pending, due
	// at once, attempt count 0, lease owner and last error cleared, history
	// kept. It takes 1..MaxBatchSize distinct, non-nil ids. Other ids are
	// left alone and missing from RequeueResult.Requeued.
	Requeue(ctx context.Context, ids ...uuid.UUID) (RequeueResult, error)

	// RequeueAll does Requeue for every message dead-lettered when the call
	// starts, in batches (Postgres: at most MaxBatchSize rows, each batch
	// its own transaction). A message dead-lettered again while the call
	// runs is left for the next call.
	//
	// Errors: the batches before the error stay requeued; calling again
	// requeues the rest.
	RequeueAll(ctx context.Context) (RequeueResult, error)

	// Purge deletes up to r.BatchSize terminal messages finished more than
	// r.OlderThan ago and returns how many: the succeeded ones oldest
	// first, then (r.IncludeDeadLettered) the dead letters oldest first,
	// those that hold their ordering keys last. Call it until it returns
	// fewer than r.BatchSize.
	//
	// Errors: with r.IncludeDeadLettered, Postgres deletes the dead letters
	// that hold their ordering keys in a second transaction; when that one
	// fails, Purge returns the first one's count beside the error.
	Purge(ctx context.Context, r PurgeRequest) (int, error)

	// Stats returns queue depth by status and lease health at the store's
	// now.
	//
	// Errors: never a *SchemaError: Stats works on an older schema (with
	// no WaitingHead before the ordering keys' migration).
	Stats(ctx context.Context) (Stats, error)

	// Get returns one message's stored state.
	//
	// Errors: ErrNotFound when the queue holds no such id.
	Get(ctx context.Context, id uuid.UUID) (Row, error)
}
