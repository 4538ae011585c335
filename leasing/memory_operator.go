package leasing

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
)

// Requeue implements Store.Requeue.
func (m *Memory) Requeue(ctx context.Context, ids ...uuid.UUID) (RequeueResult, error) {
	if err := validateIDs(ids); err != nil {
		return RequeueResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return RequeueResult{}, err
	}
	want := make(map[uuid.UUID]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	return RequeueResult{Requested: len(ids), Requeued: m.requeue(func(id uuid.UUID) bool { return want[id] })}, nil
}

// RequeueAll implements Store.RequeueAll.
func (m *Memory) RequeueAll(ctx context.Context) (RequeueResult, error) {
	if err := ctx.Err(); err != nil {
		return RequeueResult{}, err
	}
	requeued := m.requeue(func(uuid.UUID) bool { return true })
	return RequeueResult{Requested: len(requeued), Requeued: requeued}, nil
}

func (m *Memory) requeue(want func(uuid.UUID) bool) []uuid.UUID {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	requeued := []uuid.UUID{}
	var rejoining []*Row
	for id, r := range m.rows {
		if r.Status != StatusDeadLettered || !want(id) {
			continue
		}
		r.Attempts = appendAttempt(r.Attempts, Attempt{Attempt: r.AttemptCount, FinishedAt: now, End: AttemptRequeued, Operator: true})
		r.Status, r.VisibleAfter, r.AttemptCount = StatusPending, now, 0
		r.LeaseOwner, r.LeaseExpiresAt, r.LastError, r.DeadLetteredAt = "", nil, "", nil
		if r.OrderingKey != "" && !m.holdsKey(r) {
			rejoining = append(rejoining, r)
		}
		requeued = append(requeued, id)
	}
	// Rows that do not hold their key rejoin its line at the tail, in their
	// old order, as the SQL requeue does.
	sortByKeySeq(rejoining)
	for _, r := range rejoining {
		m.place(r, now)
	}
	slices.SortFunc(requeued, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	return requeued
}

// Purge implements Store.Purge.
func (m *Memory) Purge(ctx context.Context, req PurgeRequest) (int, error) {
	if err := req.validate(); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	cutoff := m.clock().Add(-req.OlderThan.Truncate(time.Microsecond))
	// As Postgres: the finished rows oldest first, then the dead letters
	// that hold no key, then (PurgeHeads) those that hold their keys
	// (strict ordering), each kind oldest first, up to BatchSize in all.
	var finished, dead, heads []*Row
	for _, r := range m.rows {
		switch {
		case r.Status == m.queue.Succeeded() && r.FinishedAt.Before(cutoff):
			finished = append(finished, r)
		case !req.IncludeDeadLettered || r.Status != StatusDeadLettered || !r.DeadLetteredAt.Before(cutoff):
		case m.holdsKey(r):
			heads = append(heads, r)
		default:
			dead = append(dead, r)
		}
	}
	slices.SortFunc(finished, func(a, b *Row) int { return a.FinishedAt.Compare(*b.FinishedAt) })
	for _, rs := range [][]*Row{dead, heads} {
		slices.SortFunc(rs, func(a, b *Row) int { return a.DeadLetteredAt.Compare(*b.DeadLetteredAt) })
	}
	doomed := slices.Concat(finished, dead, heads)
	doomed = doomed[:min(len(doomed), req.BatchSize)]
	now := m.clock()
	for _, r := range doomed {
		delete(m.rows, r.ID)
		m.purgedGeneration = max(m.purgedGeneration, r.LeaseGeneration)
		if r.Status == StatusDeadLettered && m.holdsKey(r) {
			m.advance(keyOf(r), now) // the key's next message is promoted
		}
	}
	return len(doomed), nil
}

// Stats implements Store.Stats.
func (m *Memory) Stats(ctx context.Context) (Stats, error) {
	if err := ctx.Err(); err != nil {
		return Stats{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	st := Stats{Queue: m.queue, Depth: emptyDepth(m.queue)}
	var oldest *time.Time
	for _, r := range m.rows {
		st.Depth[r.Status]++
		expired := r.Status == m.queue.InFlight() && r.LeaseExpiresAt != nil && !r.LeaseExpiresAt.After(now)
		ready := (r.Status == StatusPending || r.Status == StatusFailed) && !r.VisibleAfter.After(now)
		if expired {
			st.ExpiredLeases++
		}
		if (expired || ready) && (oldest == nil || r.CreatedAt.Before(*oldest)) {
			oldest = &r.CreatedAt
		}
	}
	if oldest != nil {
		st.OldestDueAge = now.Sub(*oldest)
	}
	st.WaitingHead = m.waitingHead(now)
	return st, nil
}

// Get implements Store.Get.
func (m *Memory) Get(ctx context.Context, id uuid.UUID) (Row, error) {
	if err := ctx.Err(); err != nil {
		return Row{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.rows[id]
	if r == nil {
		return Row{}, fmt.Errorf("%w: %s message %s", ErrNotFound, m.queue, id)
	}
	return r.clone(), nil
}
