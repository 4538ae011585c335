package leasing

import (
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/leasestore/leasestore/internal/plural"
)

var (
	// ErrInvalidArgument is matched by every *ArgumentError.
	ErrInvalidArgument = errors.New("leasing: invalid argument")

	// ErrLeaseLost is returned by WriteResult.Err and RenewResult.Err for a
	// lease that expired or was reclaimed: stop working the message.
	ErrLeaseLost = errors.New("leasing: lease lost")

	// ErrAlreadyTerminal is returned by WriteResult.Err for a message
	// finished under another lease.
	ErrAlreadyTerminal = errors.New("leasing: message already terminal")

	// ErrNotFound is returned by Get and WriteResult.Err for a message id
	// the queue does not hold.
	ErrNotFound = errors.New("leasing: message not found")
)

// ArgumentError is input rejected before any statement ran; nothing
// changed. It matches ErrInvalidArgument.
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

// ErrLockTimeout is matched by the error of a Postgres call whose statement
// waited longer than PostgresOptions.LockTimeout for a lock (the table's,
// held by DDL, or a row's, held by a long transaction). Nothing changed:
// retry the call after a pause. The error wraps the server's
// *pgconn.PgError (SQLSTATE 55P03). Memory never returns it. pgx's caching
// query modes prepare statements under the session's lock_timeout only:
// see docs/operations.md.
var ErrLockTimeout = errors.New("leasing: lock timeout")

// ErrParked is matched by every *ParkedError.
var ErrParked = errors.New("leasing: claim parked messages it could not lease")

// ParkedError is returned beside the leases of a claim that parked rows it
// could not lease: the claim dead-lettered them, in its transaction, with
// last_error "parked by the claim: <reason>", counted against the batch
// size. The leases are valid. It matches ErrParked.
//
// A row is parked when attempt_count or lease_generation is at its column
// type's limit, created_at or visible_after is ±infinity, or its headers
// are not a JSON object. The API never writes such rows (hand-written SQL
// or older versions do). Requeue resets the attempts; fix the other values
// by hand first, or the next claim parks the row again.
type ParkedError struct {
	// Queue is the queue claimed from.
	Queue Queue
	// Parked lists the parked rows, ordered by message id.
	Parked []ParkedRow
	// KeysNotFreed is the error of freeing the ordering keys the parked
	// rows held (Postgres does it in a transaction of its own after the
	// claim's), nil when it worked. Those keys then stay held until the
	// rows are requeued or purged. errors.Is and errors.As do not reach it.
	KeysNotFreed error
}

// ParkedRow is one row a claim parked.
type ParkedRow struct {
	// ID is the message id.
	ID uuid.UUID
	// Reason is the row's new last_error.
	Reason string
}

// Error names the queue, the count, the first row's reason and
// KeysNotFreed.
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

// parkedError returns a *ParkedError, or nil when parked is empty.
func parkedError(q Queue, parked []ParkedRow, keysNotFreed error) error {
	if len(parked) == 0 {
		return nil
	}
	return &ParkedError{Queue: q, Parked: parked, KeysNotFreed: keysNotFreed}
}
