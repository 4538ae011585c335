package leasing

import (
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/leasestore/leasestore/internal/plural"
)

var (
	// ErrInvalidArgument is matched (errors.Is) by every *ArgumentError: the
	// call was rejected before any statement ran and nothing changed.
	ErrInvalidArgument = errors.New("leasing: invalid argument")

	// ErrLeaseLost is returned by WriteResult.Err and RenewResult.Err when a
	// guarded write matched no row: the lease expired or was reclaimed, and
	// the caller must stop working the message.
	ErrLeaseLost = errors.New("leasing: lease lost")

	// ErrAlreadyTerminal is returned by WriteResult.Err when a message had
	// already reached a terminal state under another lease.
	ErrAlreadyTerminal = errors.New("leasing: message already terminal")

	// ErrNotFound is returned by Get, and by WriteResult.Err, for a message id
	// the queue does not hold.
	ErrNotFound = errors.New("leasing: message not found")
)

// ArgumentError describes input rejected before any statement ran.
// errors.Is(err, ErrInvalidArgument) holds for every ArgumentError.
type ArgumentError struct {
	// Field names the rejected argument, e.g. "batch size" or "owner".
	Field string
	// Reason says what is wrong with it.
	Reason string
}

// Error implements error.
func (e *ArgumentError) Error() string {
	return fmt.Sprintf("leasing: invalid %s: %s", e.Field, e.Reason)
}

// Is reports whether target is ErrInvalidArgument.
func (e *ArgumentError) Is(target error) bool { return target == ErrInvalidArgument }

func argumentError(field, format string, args ...any) error {
	return &ArgumentError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// ErrDuplicate is returned by Enqueue on the outbox when a message id is
// already present, and by EnqueueCopy on either queue when a message id or
// an idempotency key is; nothing from that batch is inserted.
var ErrDuplicate = errors.New("leasing: duplicate message id")

// ErrLockTimeout is matched (errors.Is) by the error of a Postgres call
// whose statement waited longer than PostgresOptions.LockTimeout for a lock:
// typically the queue table's, held or requested by DDL (a migration, a
// manual ALTER TABLE, LOCK TABLE), or a row lock held by a long transaction
// of the application's. The server cancelled the statement before it
// changed anything: nothing changed, so the call may be retried as it was,
// after a pause. The error also wraps the server's *pgconn.PgError (SQLSTATE
// 55P03, lock_not_available). Memory never returns it.
//
// In pgx's cache_statement (its default) and cache_describe query modes,
// pgx prepares a statement new to the connection, and again after a failed
// call, before the call's transaction starts; that step waits for a locked
// table under the session's lock_timeout only, and without one the call
// waits as long as its context allows instead. Set lock_timeout on the
// pool's sessions too, or use the exec mode (PostgresOptions.LockTimeout).
var ErrLockTimeout = errors.New("leasing: lock timeout")

// ErrParked is matched (errors.Is) by every *ParkedError.
var ErrParked = errors.New("leasing: claim parked messages it could not lease")

// ParkedError is returned by Claim and CompleteAndClaim, together with
// their normal results, when the claim reached rows it could not lease and
// parked them instead: each was dead-lettered by the claim itself, in the
// same transaction, with last_error "parked by the claim: <reason>". The
// leases returned beside it are valid and must be worked as usual; the
// parked rows counted against the batch size. errors.Is(err, ErrParked)
// holds.
//
// A row is parked when its attempt_count (integer) or lease_generation
// (bigint) is at its type's limit, so that the claim's + 1 would overflow;
// when its created_at or visible_after is ±infinity (no Go time); or when
// its headers are not a JSON object (Message.Headers promises one). The API
// never writes such rows: they come from hand-written SQL or older
// versions. Requeue puts a parked row back to pending with its attempts
// reset; fix the other values by hand first, or the next claim parks it
// again.
type ParkedError struct {
	// Queue is the queue claimed from.
	Queue Queue
	// Parked lists the parked rows, ordered by message id.
	Parked []ParkedRow
	// KeysNotFreed is nil unless freeing the ordering keys of parked rows
	// that were their keys' heads failed (Postgres does it in a
	// transaction of its own, right after the claim's, even when the
	// claim's context has ended). Those keys then stay held, as under
	// strict ordering, until the parked rows are requeued or purged;
	// leasectl doctor names the longest-held key. errors.Is and errors.As
	// on the *ParkedError do not reach it: the claim and its leases are
	// good.
	KeysNotFreed error
}

// ParkedRow is one row a claim parked.
type ParkedRow struct {
	// ID is the message id.
	ID uuid.UUID
	// Reason is the row's new last_error: "parked by the claim: ..." and
	// what is wrong with the row.
	Reason string
}

// Error implements error: the queue, the count, the first row's reason
// and, when set, KeysNotFreed.
func (e *ParkedError) Error() string {
	if len(e.Parked) == 0 {
		return fmt.Sprintf("leasing: claim %s parked no messages", e.Queue)
	}
	msg := fmt.Sprintf("leasing: claim %s parked %s as dead_lettered; first %s: %s",
		e.Queue, plural.Count(len(e.Parked), "message", "messages"), e.Parked[0].ID, e.Parked[0].Reason)
	if e.KeysNotFreed != nil {
		msg += "; their ordering keys stay held until they are requeued or purged: " + e.KeysNotFreed.Error()
	}
	return msg
}

// Is reports whether target is ErrParked.
func (e *ParkedError) Is(target error) bool { return target == ErrParked }

// parkedError returns a *ParkedError for parked and the error of freeing
// their keys, or nil when parked is empty.
func parkedError(q Queue, parked []ParkedRow, keysNotFreed error) error {
	if len(parked) == 0 {
		return nil
	}
	return &ParkedError{Queue: q, Parked: parked, KeysNotFreed: keysNotFreed}
}
