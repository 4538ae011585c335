package leasing

import (
	"bytes"
	"context"
	"slices"
	"time"

	"github.com/google/uuid"
)

// memKey is Memory's row of one ordering key: as *_ordering_keys.
type memKey struct {
	lastSeq int64
	head    uuid.UUID
	since   time.Time
}

// keyOf returns the key of r: tenant and ordering key.
func keyOf(r *Row) [2]string { return [2]string{r.TenantID, r.OrderingKey} }

// StrictOrdering reports whether strict ordering is on (see
// Postgres.SetStrictOrdering).
func (m *Memory) StrictOrdering(ctx context.Context) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.strict, nil
}

// SetStrictOrdering implements Postgres.SetStrictOrdering for this store.
func (m *Memory) SetStrictOrdering(ctx context.Context, strict bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.strict = strict
	if !strict {
		// The keys strict mode held for dead-lettered heads are freed.
		now := m.clock()
		for _, k := range m.keys {
			if r := m.rows[k.head]; r != nil {
				m.finishHead(r, now)
			}
		}
	}
	return nil
}

// place puts the keyed row r at the tail of its key's line, as the SQL
// enqueue and requeue do: the head when the key has no row, else waiting.
func (m *Memory) place(r *Row, now time.Time) {
	k := m.keys[keyOf(r)]
	if k == nil {
		m.keys[keyOf(r)] = &memKey{lastSeq: 1, head: r.ID, since: now}
		r.KeySeq, r.Status = 1, StatusPending
		return
	}
	k.lastSeq++
	r.KeySeq, r.Status = k.lastSeq, StatusWaiting
}

// holdsKey reports whether r is its key's head. The caller holds m.mu.
func (m *Memory) holdsKey(r *Row) bool {
	k := m.keys[keyOf(r)]
	return r.OrderingKey != "" && k != nil && k.head == r.ID
}

// finishHead advances r's key when r is its head and has finished
// (succeeded, or dead-lettered without strict ordering), as the SQL does.
func (m *Memory) finishHead(r *Row, now time.Time) {
	if !m.holdsKey(r) {
		return
	}
	if r.Status != m.queue.Succeeded() && (r.Status != StatusDeadLettered || m.strict) {
		return
	}
	m.advance(keyOf(r), now)
}

// advance promotes the first waiting message of key, or drops the key.
func (m *Memory) advance(key [2]string, now time.Time) {
	var next *Row
	for _, w := range m.rows {
		if w.Status == StatusWaiting && keyOf(w) == key && (next == nil || w.KeySeq < next.KeySeq) {
			next = w
		}
	}
	if next == nil {
		delete(m.keys, key)
		return
	}
	next.Status = StatusPending
	if next.VisibleAfter.Before(now) {
		next.VisibleAfter = now
	}
	k := m.keys[key]
	k.head, k.since = next.ID, now
}

// waitingHead returns Stats.WaitingHead.
func (m *Memory) waitingHead(now time.Time) *WaitingHead {
	waiting := map[[2]string]bool{}
	for _, r := range m.rows {
		if r.Status == StatusWaiting {
			waiting[keyOf(r)] = true
		}
	}
	var best *WaitingHead
	var bestSince time.Time
	for key, k := range m.keys {
		if !waiting[key] {
			continue
		}
		better := best == nil || k.since.Before(bestSince) ||
			(k.since.Equal(bestSince) && (key[0] < best.TenantID || (key[0] == best.TenantID && key[1] < best.OrderingKey)))
		if better {
			best, bestSince = &WaitingHead{TenantID: key[0], OrderingKey: key[1], MessageID: k.head, Age: now.Sub(k.since)}, k.since
		}
	}
	return best
}

// sortByKeySeq orders rows by (KeySeq, ID), the order in which requeued
// rows of one key rejoin its line.
func sortByKeySeq(rows []*Row) {
	slices.SortFunc(rows, func(a, b *Row) int {
		if a.KeySeq != b.KeySeq {
			if a.KeySeq < b.KeySeq {
				return -1
			}
			return 1
		}
		return bytes.Compare(a.ID[:], b.ID[:])
	})
}
