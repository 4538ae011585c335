package leasing

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/leasestore/leasestore/gen"
)

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
// SQL: db/queries/operator.sql.tmpl (InboxDeadLetterByID).
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
