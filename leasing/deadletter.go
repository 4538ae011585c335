package leasing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/leasestore/leasestore/gen"
)

// DeadLetterByIDRequest is an operator's dead-letter of one message by id:
// for a poison message that must stop now, not after its attempts run out.
type DeadLetterByIDRequest struct {
	// ID is the message to dead-letter.
	ID uuid.UUID
	// Reason is why, for whoever triages the dead letters: stored as the
	// row's last error (cut to MaxErrorBytes like Failure.Error) and in the
	// history entry (cut to MaxAttemptErrorBytes). UTF-8 without NUL, not
	// blank: unlike Failure.Error, which is sanitized, a bad reason is
	// refused.
	Reason string
	// Force dead-letters the message even while a live (unexpired) lease
	// holds it. That lease is fenced: its holder's later writes report
	// terminal and its renewals lost, so it stops. Without Force such a
	// message is refused with a *LeaseHeldError.
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

// ErrLeaseHeld is matched (errors.Is) by every *LeaseHeldError: an operator
// action was refused because a live lease holds the message.
var ErrLeaseHeld = errors.New("leasing: message held by a live lease")

// LeaseHeldError is DeadLetterByID's refusal of a message that a live lease
// holds; nothing changed. errors.Is(err, ErrLeaseHeld) holds.
type LeaseHeldError struct {
	// Queue and ID name the message.
	Queue Queue
	ID    uuid.UUID
	// Owner is the lease's owner.
	Owner string
	// ExpiresAt is when the lease ends unless renewed: database clock, UTC.
	ExpiresAt time.Time
}

// Error implements error.
func (e *LeaseHeldError) Error() string {
	return fmt.Sprintf("leasing: %s message %s is leased to %q until %s (force to fence the lease)",
		e.Queue, e.ID, e.Owner, e.ExpiresAt.Format(time.RFC3339Nano))
}

// Is reports whether target is ErrLeaseHeld.
func (e *LeaseHeldError) Is(target error) bool { return target == ErrLeaseHeld }

// DeadLetterByID dead-letters one message by id, as an operator: its status
// becomes dead_lettered with r.Reason as its last error, its attempt count
// stays, and an entry with Operator set (and Forced, when it cut a live
// lease) is appended to its attempt history. A pending or failed message,
// or one whose lease has expired, is dead-lettered at once; an in-flight
// message has its lease fenced (the generation moves on), so that its holder
// cannot write it again. Requeue undoes it. One statement; Postgres locks
// the row, so that a concurrent claim or outcome write goes first or after,
// never halfway.
//
// Returns the history entry written (times database clock, UTC).
//
// Errors: an *ArgumentError for a nil id, or a reason that is blank, not
// UTF-8 or holds NUL (nothing sent);
// ErrNotFound when the queue holds no such message; ErrAlreadyTerminal when
// it is completed, published or already dead-lettered; a *LeaseHeldError
// (errors.Is ErrLeaseHeld) when a live lease holds it and r.Force is false;
// in each of these nothing changed. Postgres also returns a *SchemaError
// (errors.Is ErrSchema) while the schema is behind and ErrLockTimeout past
// PostgresOptions.LockTimeout, with nothing changed. Otherwise the driver
// error.
//
// SQL: db/queries/queue.sql.tmpl InboxDeadLetterByID / OutboxDeadLetterByID.
func (s *Postgres) DeadLetterByID(ctx context.Context, r DeadLetterByIDRequest) (Attempt, error) {
	if err := r.validate(); err != nil {
		return Attempt{}, err
	}
	now := s.pinned()
	var res deadLetterByID
	steps := append([]func(gen.DBTX) error{
		func(db gen.DBTX) (err error) { res, err = s.sql.deadLetterByID(ctx, db, now, r); return err },
	}, s.keySteps(ctx, []uuid.UUID{r.ID})...)
	err := s.pipelineSessionPlans(ctx, steps...)
	if err != nil {
		return Attempt{}, fmt.Errorf("leasing: dead-letter %s message %s: %w", s.queue, r.ID, err)
	}
	switch res.outcome {
	case "applied":
		var a Attempt
		if err := json.Unmarshal(res.entry, &a); err != nil {
			return Attempt{}, fmt.Errorf("leasing: dead-letter %s message %s: history entry: %w", s.queue, r.ID, err)
		}
		a.FinishedAt, a.ClaimedAt = a.FinishedAt.UTC(), utc(a.ClaimedAt)
		return a, nil
	case "leased":
		var expires time.Time
		if res.leaseExpiresAt != nil {
			expires = *res.leaseExpiresAt
		}
		return Attempt{}, &LeaseHeldError{Queue: s.queue, ID: r.ID, Owner: res.leaseOwner, ExpiresAt: expires}
	}
	return Attempt{}, operatorRefusal(s.queue, r.ID, res.outcome, res.status)
}

// operatorRefusal is the error of an operator action refused with outcome
// not_found or terminal (status is the message's).
func operatorRefusal(q Queue, id uuid.UUID, outcome string, status Status) error {
	switch outcome {
	case "not_found":
		return fmt.Errorf("%w: %s message %s", ErrNotFound, q, id)
	case "terminal":
		return fmt.Errorf("%w: %s message %s is %s", ErrAlreadyTerminal, q, id, status)
	}
	return fmt.Errorf("leasing: dead-letter %s message %s: unexpected outcome %q", q, id, outcome)
}

// DeadLetterByID implements Postgres.DeadLetterByID on the store's clock,
// with the same checks, outcomes and history entry.
func (m *Memory) DeadLetterByID(ctx context.Context, r DeadLetterByIDRequest) (Attempt, error) {
	if err := r.validate(); err != nil {
		return Attempt{}, err
	}
	if err := ctx.Err(); err != nil {
		return Attempt{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	row := m.rows[r.ID]
	switch {
	case row == nil:
		return Attempt{}, operatorRefusal(m.queue, r.ID, "not_found", "")
	case row.Status.Terminal():
		return Attempt{}, operatorRefusal(m.queue, r.ID, "terminal", row.Status)
	}
	inFlight := row.Status == m.queue.InFlight()
	// A legacy in-flight row without expiry (Load) counts as live: no claim
	// is there to say whether it would be reclaimed.
	live := inFlight && (row.LeaseExpiresAt == nil || row.LeaseExpiresAt.After(now))
	if live && !r.Force {
		var expires time.Time
		if row.LeaseExpiresAt != nil {
			expires = *row.LeaseExpiresAt
		}
		return Attempt{}, &LeaseHeldError{Queue: m.queue, ID: r.ID, Owner: row.LeaseOwner, ExpiresAt: expires}
	}
	a := Attempt{Attempt: row.AttemptCount, FinishedAt: now, Outcome: AttemptDeadLettered, Error: attemptError(r.Reason), Operator: true}
	if inFlight {
		a.Generation, a.Owner, a.ClaimedAt = row.LeaseGeneration, row.LeaseOwner, cloneTime(row.LastAttemptedAt)
		a.Forced = live && row.LeaseExpiresAt != nil
		if row.LeaseGeneration < math.MaxInt64 { // as the SQL: at the limit it stays
			row.LeaseGeneration++
		}
	}
	dead := now
	row.Status, row.DeadLetteredAt, row.LastError = StatusDeadLettered, &dead, SanitizeError(r.Reason)
	row.LeaseOwner, row.LeaseExpiresAt = "", nil
	row.Attempts = appendAttempt(row.Attempts, a)
	m.finishHead(row, now)
	return a, nil
}

// cloneTime returns a copy of *t, or nil.
func cloneTime(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	c := *t
	return &c
}
