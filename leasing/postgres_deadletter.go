package leasing

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/leasestore/leasestore/gen"
)

// DeadLetterByID dead-letters one message by id, as an operator, in one
// statement that locks the row: its status becomes dead_lettered with
// r.Reason as its last error, its attempt count stays, and an entry with
// Operator set (and Forced, when it cut a live lease) is appended to its
// history. An in-flight message has its lease fenced (the generation moves
// on), so that its holder cannot write it again. Requeue undoes it.
// Returns the entry written.
//
// Errors, beyond Store's, each with nothing changed: an *ArgumentError for
// a nil id or a bad reason; ErrNotFound; ErrAlreadyTerminal when it is
// finished or already dead-lettered; a *LeaseHeldError (errors.Is
// ErrLeaseHeld) when a live lease holds it and r.Force is false.
//
// SQL: db/queries/operator.sql.tmpl (InboxDeadLetterByID).
func (s *Postgres) DeadLetterByID(ctx context.Context, r DeadLetterByIDRequest) (Attempt, error) {
	if err := r.validate(); err != nil {
		return Attempt{}, err
	}
	dead := bind(s.q.deadLetterByID, gen.InboxDeadLetterByIDParams{
		MessageID: r.ID, Now: s.pinned(), Reason: SanitizeError(r.Reason), AttemptError: attemptError(r.Reason), Force: r.Force,
	})
	if err := s.send(ctx, operator, append([]step{dead}, s.keySteps([]uuid.UUID{r.ID})...)...); err != nil {
		return Attempt{}, fmt.Errorf("leasing: dead-letter %s message %s: %w", s.queue, r.ID, err)
	}
	res := dead.out
	switch res.Outcome {
	case "applied":
		var a Attempt
		if err := json.Unmarshal(res.Entry, &a); err != nil {
			return Attempt{}, fmt.Errorf("leasing: dead-letter %s message %s: history entry: %w", s.queue, r.ID, err)
		}
		a.FinishedAt, a.ClaimedAt = a.FinishedAt.UTC(), utc(a.ClaimedAt)
		return a, nil
	case "leased":
		var expires time.Time
		if res.LeaseExpiresAt != nil {
			expires = res.LeaseExpiresAt.UTC()
		}
		return Attempt{}, &LeaseHeldError{Queue: s.queue, ID: r.ID, Owner: res.LeaseOwner, ExpiresAt: expires}
	}
	return Attempt{}, operatorRefusal(s.queue, r.ID, res.Outcome, Status(res.Status))
}
