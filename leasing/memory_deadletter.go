package leasing

import (
	"context"
	"math"
	"time"
)

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
	a := Attempt{Attempt: row.AttemptCount, FinishedAt: now, End: AttemptDeadLettered, Error: attemptError(r.Reason), Operator: true}
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
