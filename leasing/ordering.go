package leasing

import (
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// validateOrderingKey checks message i's ordering key.
func validateOrderingKey(i int, key string) error {
	switch {
	case len(key) > MaxOrderingKeyBytes:
		return argumentError("ordering key", "must be at most %d bytes, got %d (message %d)", MaxOrderingKeyBytes, len(key), i)
	case !utf8.ValidString(key):
		return argumentError("ordering key", "must be valid UTF-8 (message %d)", i)
	case !validText(key):
		return argumentError("ordering key", "must not contain NUL (message %d)", i)
	}
	return nil
}

// initialStatus is waiting for a keyed message (until placed in its
// key's line), else pending.
func initialStatus(m NewMessage) Status {
	if m.OrderingKey != "" {
		return StatusWaiting
	}
	return StatusPending
}

// hasKeys reports whether some message of msgs has an ordering key.
func hasKeys(msgs []NewMessage) bool {
	return slices.ContainsFunc(msgs, func(m NewMessage) bool { return m.OrderingKey != "" })
}

// keyedIDs returns the ids of the keyed messages among leases, or nil.
func keyedIDs(leases []Lease) []uuid.UUID {
	var ids []uuid.UUID
	for _, l := range leases {
		if l.Message.OrderingKey != "" {
			ids = append(ids, l.Message.ID)
		}
	}
	return ids
}

// WaitingHead is the ordering key's head that has held its key longest
// while messages wait behind it (Stats.WaitingHead).
type WaitingHead struct {
	// TenantID is the key's tenant; empty for none.
	TenantID string
	// OrderingKey is the key.
	OrderingKey string
	// MessageID is the head.
	MessageID uuid.UUID
	// Age is how long it has been the key's head.
	Age time.Duration
}

// ErrOrderingKeyConflict is matched by every *OrderingKeyConflictError.
var ErrOrderingKeyConflict = errors.New("leasing: duplicate message with another ordering key")

// OrderingKeyConflictError is an inbox Enqueue's refusal of a keyed
// duplicate (by id, or by tenant and idempotency key) whose stored message
// has another ordering key or none; nothing was inserted. An unkeyed
// duplicate is skipped, whatever the stored key. Postgres checks committed
// messages only: an uncommitted duplicate is skipped.
type OrderingKeyConflictError struct {
	// ID is the id of the refused input message.
	ID uuid.UUID
}

// Error implements error.
func (e *OrderingKeyConflictError) Error() string {
	return fmt.Sprintf("leasing: inbox message %s duplicates a stored message of another ordering key", e.ID)
}

// Is reports whether target is ErrOrderingKeyConflict.
func (e *OrderingKeyConflictError) Is(target error) bool { return target == ErrOrderingKeyConflict }
