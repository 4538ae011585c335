package leasing

import (
	"errors"
	"fmt"
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
var ErrLockTimeout = errors.New("leasing: lock timeout")
