package leasing

import (
	"bytes"
	"context"
	"slices"
	"time"

	"github.com/google/uuid"
)

// holds reports whether l is the current lease on r.
func (m *Memory) holds(r *Row, l Lease) bool {
	return r != nil && r.Status == m.queue.InFlight() && r.LeaseOwner == l.Owner && r.LeaseGeneration == l.Generation
}

// Renew implements Store.Renew.
func (m *Memory) Renew(ctx context.Context, leaseFor time.Duration, leases ...Lease) (RenewResult, error) {
	if _, err := validateLeases(m.queue, leases); err != nil {
		return RenewResult{}, err
	}
	if err := validateLeaseFor(leaseFor); err != nil {
		return RenewResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return RenewResult{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	expiry := map[uuid.UUID]time.Time{}
	for _, l := range leases {
		r := m.rows[l.Message.ID]
		if m.holds(r, l) && r.LeaseExpiresAt != nil && r.LeaseExpiresAt.After(now) {
			t := now.Add(leaseFor.Truncate(time.Microsecond))
			r.LeaseExpiresAt = &t
			expiry[l.Message.ID] = t
		}
	}
	return renewResult(leases, expiry), nil
}

// write applies set to every row its lease still holds, with the
// attempt's history entry, and classifies the rest as the SQL does:
// already applied (history entry, or done for older rows), terminal, lost,
// not found. column, if set, goes to LastWriteGeneration and LastWrite.
func (m *Memory) write(leases []Lease, outcome AttemptEnd, column string, errText func(int) string,
	done func(*Row, Lease) bool, set func(*Row, int, time.Time)) WriteResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	res := WriteResult{Outcomes: make([]MessageOutcome, len(leases))}
	for i, l := range leases {
		r := m.rows[l.Message.ID]
		var o Outcome
		switch {
		case m.holds(r, l):
			a := m.attemptOf(r, outcome, now)
			if errText != nil {
				a.Error = attemptError(errText(i))
			}
			set(r, i, now)
			r.Attempts = appendAttempt(r.Attempts, a)
			m.finishHead(r, now)
			if column != "" {
				r.LastWriteGeneration, r.LastWrite = r.LeaseGeneration, column
			}
			o = OutcomeApplied
		case r == nil:
			o = OutcomeNotFound
		case wrote(r.Attempts, l.Owner, l.Generation, outcome) || done(r, l):
			o = OutcomeAlreadyApplied
		case r.Status.Terminal():
			o = OutcomeTerminal
		default:
			o = OutcomeLost
		}
		res.Outcomes[i] = MessageOutcome{MessageID: l.Message.ID, Outcome: o}
	}
	return res
}

// attemptOf returns the history entry of r's current lease ending now.
func (m *Memory) attemptOf(r *Row, outcome AttemptEnd, now time.Time) Attempt {
	return Attempt{
		Attempt: r.AttemptCount, Generation: r.LeaseGeneration, Owner: r.LeaseOwner,
		ClaimedAt: cloneTime(r.LastAttemptedAt), FinishedAt: now, End: outcome,
	}
}

// wroteAs returns a done check: r is in status s under lease l.
func wroteAs(s Status) func(*Row, Lease) bool {
	return func(r *Row, l Lease) bool {
		return r.Status == s && r.LeaseOwner == l.Owner && r.LeaseGeneration == l.Generation
	}
}

// recorded returns a done check: lease l's generation wrote outcome.
func recorded(outcome string) func(*Row, Lease) bool {
	return func(r *Row, l Lease) bool {
		return r.LastWriteGeneration == l.Generation && r.LastWrite == outcome
	}
}

// Release implements Store.Release.
func (m *Memory) Release(ctx context.Context, leases ...Lease) (WriteResult, error) {
	if _, err := validateLeases(m.queue, leases); err != nil {
		return WriteResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return WriteResult{}, err
	}
	return m.write(leases, AttemptReleased, "released", nil, recorded("released"), func(r *Row, _ int, now time.Time) {
		release(r, now)
	}), nil
}

// ReleaseAfter implements Store.ReleaseAfter.
func (m *Memory) ReleaseAfter(ctx context.Context, failures ...Failure) (WriteResult, error) {
	if _, err := validateFailures(m.queue, failures); err != nil {
		return WriteResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return WriteResult{}, err
	}
	errText := func(i int) string { return failures[i].Error }
	return m.write(leasesOf(failures), AttemptReleased, "released", errText, recorded("released"), func(r *Row, i int, now time.Time) {
		release(r, now.Add(failures[i].RetryAfter.Truncate(time.Microsecond)))
		r.LastError = SanitizeError(failures[i].Error)
	}), nil
}

// release gives r's lease back: pending and due at visibleAfter, lease
// owner and expiry cleared, the attempt the claim counted returned.
func release(r *Row, visibleAfter time.Time) {
	r.Status, r.VisibleAfter, r.LeaseOwner, r.LeaseExpiresAt = StatusPending, visibleAfter, "", nil
	r.AttemptCount = max(r.AttemptCount-1, 0)
}

// ReleaseOrphans implements Store.ReleaseOrphans.
func (m *Memory) ReleaseOrphans(ctx context.Context, owner string, held []uuid.UUID) ([]uuid.UUID, error) {
	if err := validateOwner(owner); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	keep := make(map[uuid.UUID]bool, len(held))
	for _, id := range held {
		keep[id] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	released := []uuid.UUID{}
	for id, r := range m.rows {
		if r.Status != m.queue.InFlight() || r.LeaseOwner != owner || keep[id] ||
			r.LeaseExpiresAt == nil || !r.LeaseExpiresAt.After(now) {
			continue
		}
		a := m.attemptOf(r, AttemptReleased, now)
		release(r, now)
		r.Attempts = appendAttempt(r.Attempts, a)
		r.LastWriteGeneration, r.LastWrite = r.LeaseGeneration, "released"
		released = append(released, id)
	}
	slices.SortFunc(released, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	return released, nil
}

// CompleteAndClaim does Complete for done, then Claim for r, as
// Postgres.CompleteAndClaim does in one round trip: both inputs are
// validated and ctx checked before either half runs, and then both run.
// done may be empty. Rows the claim parked come back as a *ParkedError
// beside both results.
func (m *Memory) CompleteAndClaim(ctx context.Context, done []Lease, r ClaimRequest) (WriteResult, []Lease, error) {
	if len(done) > 0 {
		if _, err := validateLeases(m.queue, done); err != nil {
			return WriteResult{}, nil, err
		}
	}
	if err := r.Validate(); err != nil {
		return WriteResult{}, nil, err
	}
	if err := ctx.Err(); err != nil {
		return WriteResult{}, nil, err
	}
	// Past this point both halves run: a cancellation must not split them.
	ctx = context.WithoutCancel(ctx)
	res := WriteResult{Outcomes: []MessageOutcome{}}
	if len(done) > 0 {
		res, _ = m.Complete(ctx, done...)
	}
	leases, err := m.Claim(ctx, r) // nil or a *ParkedError
	return res, leases, err
}

// Complete implements Store.Complete.
func (m *Memory) Complete(ctx context.Context, leases ...Lease) (WriteResult, error) {
	if _, err := validateLeases(m.queue, leases); err != nil {
		return WriteResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return WriteResult{}, err
	}
	return m.write(leases, AttemptEnd(m.queue.Succeeded()), "", nil, wroteAs(m.queue.Succeeded()), func(r *Row, _ int, now time.Time) {
		r.Status, r.FinishedAt, r.LeaseExpiresAt = m.queue.Succeeded(), &now, nil
	}), nil
}

// Fail implements Store.Fail.
func (m *Memory) Fail(ctx context.Context, failures ...Failure) (WriteResult, error) {
	if _, err := validateFailures(m.queue, failures); err != nil {
		return WriteResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return WriteResult{}, err
	}
	errText := func(i int) string { return failures[i].Error }
	return m.write(leasesOf(failures), AttemptFailed, "failed", errText, recorded("failed"), func(r *Row, i int, now time.Time) {
		r.Status, r.LeaseExpiresAt = StatusFailed, nil
		r.VisibleAfter = now.Add(failures[i].RetryAfter.Truncate(time.Microsecond))
		r.LastError = SanitizeError(failures[i].Error)
	}), nil
}

// DeadLetter implements Store.DeadLetter.
func (m *Memory) DeadLetter(ctx context.Context, failures ...Failure) (WriteResult, error) {
	if _, err := validateFailures(m.queue, failures); err != nil {
		return WriteResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return WriteResult{}, err
	}
	errText := func(i int) string { return failures[i].Error }
	return m.write(leasesOf(failures), AttemptDeadLettered, "dead_lettered", errText, recorded("dead_lettered"), func(r *Row, i int, now time.Time) {
		r.Status, r.DeadLetteredAt, r.LeaseExpiresAt = StatusDeadLettered, &now, nil
		r.LastError = SanitizeError(failures[i].Error)
	}), nil
}
