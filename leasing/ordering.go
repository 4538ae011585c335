package leasing

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/leasestore/leasestore/gen"
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

// initialStatus is the status a message is inserted with: waiting for a
// keyed message until EnqueueOrder places it, else pending.
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

// WaitingHead is the head of an ordering key with messages waiting behind
// it, as Stats reports the one that has held its key longest.
type WaitingHead struct {
	// TenantID is the key's tenant; empty for none.
	TenantID string
	// OrderingKey is the key.
	OrderingKey string
	// MessageID is the head, the message that holds the key.
	MessageID uuid.UUID
	// Age is how long it has been the key's head (database clock).
	Age time.Duration
}

// ErrOrderingKeyConflict is matched (errors.Is) by every
// *OrderingKeyConflictError.
var ErrOrderingKeyConflict = errors.New("leasing: duplicate message with another ordering key")

// OrderingKeyConflictError is an inbox Enqueue's refusal of a keyed
// duplicate (by message id, or by tenant and idempotency key) whose stored
// message has another ordering key, or none: no message of the call was
// inserted. (A duplicate without an ordering key is skipped as a
// duplicate, as ever, whatever the stored message's key.) Postgres checks
// against committed messages: a duplicate that another transaction has
// not committed yet is skipped. errors.Is(err, ErrOrderingKeyConflict)
// holds.
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

// StrictOrdering reports whether strict ordering is on for the store's
// queue (see SetStrictOrdering).
//
// Errors: the driver error.
func (s *Postgres) StrictOrdering(ctx context.Context) (bool, error) {
	var strict bool
	err := s.pipelineSessionPlans(ctx, func(db gen.DBTX) (err error) {
		strict, err = gen.New().OrderingStrict(ctx, db, gen.OrderingStrictParams{Queue: string(s.queue)})
		return mapErr(err)
	})
	if err != nil {
		return false, fmt.Errorf("leasing: strict ordering %s: %w", s.queue, err)
	}
	return strict, nil
}

// SetStrictOrdering turns strict ordering on or off for the store's queue,
// for every process at once: it is stored in the database
// (leasestore_queue_settings) and read by every dead-letter write. With it
// on, a dead-lettered head keeps its key blocked until it is requeued or
// purged; off (the default), a dead-lettered head frees its key. The
// setting applies to heads dead-lettered from then on.
//
// Errors: the driver error.
func (s *Postgres) SetStrictOrdering(ctx context.Context, strict bool) error {
	err := s.pipelineSessionPlans(ctx, func(db gen.DBTX) error {
		return mapErr(gen.New().OrderingSetStrict(ctx, db, gen.OrderingSetStrictParams{Queue: string(s.queue), StrictOrdering: strict}))
	})
	if err != nil {
		return fmt.Errorf("leasing: set strict ordering %s: %w", s.queue, err)
	}
	return nil
}

// keySteps returns the pipeline steps that free the keys of the finished
// heads among ids and promote the next message of each: KeyLock, then
// KeyAdvance as a statement of its own, whose snapshot follows the locks
// (see db/queries/queue.sql.tmpl). None when ids is empty.
func (s *Postgres) keySteps(ctx context.Context, ids []uuid.UUID) []func(gen.DBTX) error {
	if len(ids) == 0 {
		return nil
	}
	now := s.pinned()
	return []func(gen.DBTX) error{
		func(db gen.DBTX) error { _, err := s.sql.keyLock(ctx, db, ids); return err },
		func(db gen.DBTX) error { _, err := s.sql.keyAdvance(ctx, db, now, ids); return err },
	}
}

// parkedKeysTimeout bounds releaseParked, which runs after the claim's
// context may have ended.
const parkedKeysTimeout = 10 * time.Second

// releaseParked frees the keys of rows a claim parked (dead-lettered) that
// were their keys' heads, in a transaction of its own after the claim's.
// The claim has committed the parking, so the release runs even when ctx
// has ended since, for at most parkedKeysTimeout. Should it fail, such a
// key stays blocked, as in strict ordering, until the parked row is
// requeued or purged; the error says so (ParkedError.KeysNotFreed).
func (s *Postgres) releaseParked(ctx context.Context, parked []ParkedRow) error {
	if len(parked) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), parkedKeysTimeout)
	defer cancel()
	ids := make([]uuid.UUID, len(parked))
	for i, p := range parked {
		ids[i] = p.ID
	}
	if err := s.pipelineSessionPlans(ctx, s.keySteps(ctx, ids)...); err != nil {
		return fmt.Errorf("leasing: free the keys of the messages the claim of %s parked: %w", s.queue, err)
	}
	return nil
}

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
	return nil
}

// place gives the new keyed row r its place in its key's line at now, as
// EnqueueOrder (and the requeue of a row that does not hold its key) does:
// the head when the key has no row, else waiting. The caller holds m.mu.
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

// finishHead frees r's key when r is its key's head and has finished (as
// KeyRelease decides) and promotes the key's next waiting message (as
// KeyAdvance), or drops the key when none waits. The caller holds m.mu.
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

// waitingHead returns the key whose head has held it longest while messages
// wait behind it, or nil. The caller holds m.mu.
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
