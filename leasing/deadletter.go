package leasing

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
)

// DeadLetterByIDRequest is an operator's dead-letter of one message by id:
// for a poison message that must stop now, not after its attempts run out.
type DeadLetterByIDRequest struct {
	// ID is the message to dead-letter.
	ID uuid.UUID
	// Reason is stored as the last error and in the history entry: UTF-8
	// without NUL, not blank (refused, not sanitized, when bad).
	Reason string
	// Force dead-letters the message under a live lease, which is then
	// fenced (its writes report terminal); without it, a *LeaseHeldError.
	Force bool
}

func (r DeadLetterByIDRequest) validate() error {
	if r.ID == uuid.Nil {
		return argumentError("message id", "must not be the nil UUID")
	}
	if strings.TrimSpace(r.Reason) == "" {
		return argumentError("reason", "must not be blank")
	}
	if !validText(r.Reason) {
		return argumentError("reason", "must be UTF-8 without NUL")
	}
	return nil
}

// ErrLeaseHeld is matched by every *LeaseHeldError.
var ErrLeaseHeld = errors.New("leasing: message held by a live lease")

// LeaseHeldError is DeadLetterByID's refusal of a message that a live lease
// holds; nothing changed.
type LeaseHeldError struct {
	// Queue and ID name the message.
	Queue Queue
	ID    uuid.UUID
	// Owner is the lease's owner.
	Owner string
	// ExpiresAt is when the lease ends unless renewed.
	ExpiresAt time.Time
}

// Error implements error.
func (e *LeaseHeldError) Error() string {
	return fmt.Sprintf("leasing: %s message %s is leased to %q until %s (force to fence the lease)",
		e.Queue, e.ID, e.Owner, e.ExpiresAt.Format(time.RFC3339Nano))
}

// Is reports whether target is ErrLeaseHeld.
func (e *LeaseHeldError) Is(target error) bool { return target == ErrLeaseHeld }

// operatorRefusal is the error of an operator action refused as
// not_found or terminal.
func operatorRefusal(q Queue, id uuid.UUID, outcome string, status Status) error {
	switch outcome {
	case "not_found":
		return fmt.Errorf("%w: %s message %s", ErrNotFound, q, id)
	case "terminal":
		return fmt.Errorf("%w: %s message %s is %s", ErrAlreadyTerminal, q, id, status)
	}
	return fmt.Errorf("leasing: dead-letter %s message %s: unexpected outcome %q", q, id, outcome)
}
