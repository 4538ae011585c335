package leasing

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Enqueue implements Store.Enqueue.
func (m *Memory) Enqueue(ctx context.Context, msgs ...NewMessage) (res EnqueueResult, err error) {
	msgs, err = validateMessages(m.queue, msgs)
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return EnqueueResult{}, err
	}
	_, span, msgs := m.tracing.send(ctx, m.queue, msgs)
	defer func() { endSend(span, len(res.Duplicates), err) }()
	m.mu.Lock()
	defer m.mu.Unlock()
	added, res, err := m.planEnqueue(msgs, nil)
	if err != nil {
		return EnqueueResult{}, err
	}
	m.insert(added)
	return res, nil
}

// planEnqueue returns the rows that enqueuing msgs adds, in input order,
// and the call's result, against the stored rows and pending, rows that
// an open MemoryTx added; it changes nothing. The caller holds m.mu.
//
// Errors: an *OrderingKeyConflictError or ErrDuplicate (outbox), as
// Enqueue's.
func (m *Memory) planEnqueue(msgs []NewMessage, pending []*Row) ([]*Row, EnqueueResult, error) {
	byID := make(map[uuid.UUID]*Row, len(pending)+len(msgs))
	keys := map[[2]string]*Row{}
	for _, r := range m.rows {
		if r.IdempotencyKey != "" {
			keys[[2]string{r.TenantID, r.IdempotencyKey}] = r
		}
	}
	for _, r := range pending {
		byID[r.ID] = r
		if r.IdempotencyKey != "" {
			keys[[2]string{r.TenantID, r.IdempotencyKey}] = r
		}
	}
	stored := func(id uuid.UUID) *Row {
		if r := m.rows[id]; r != nil {
			return r
		}
		return byID[id]
	}
	for _, msg := range msgs {
		// As the SQL: a keyed duplicate of a stored message of another
		// ordering key (or none) fails the call, before anything is inserted.
		if m.queue != Inbox || msg.OrderingKey == "" {
			continue
		}
		if r := stored(msg.ID); r != nil && r.OrderingKey != msg.OrderingKey {
			return nil, EnqueueResult{}, &OrderingKeyConflictError{ID: msg.ID}
		}
		if r := keys[[2]string{msg.TenantID, msg.IdempotencyKey}]; msg.IdempotencyKey != "" && r != nil &&
			r.OrderingKey != msg.OrderingKey {
			return nil, EnqueueResult{}, &OrderingKeyConflictError{ID: msg.ID}
		}
	}
	inserted := []uuid.UUID{}
	dups := map[int]uuid.UUID{}
	var added []*Row // in input order
	for i, msg := range msgs {
		if r := stored(msg.ID); r != nil {
			if m.queue == Outbox {
				return nil, EnqueueResult{}, fmt.Errorf("%w: outbox message %s", ErrDuplicate, msg.ID)
			}
			dups[i] = r.ID
			continue
		}
		key := [2]string{msg.TenantID, msg.IdempotencyKey}
		if r := keys[key]; msg.IdempotencyKey != "" && r != nil {
			dups[i] = r.ID
			continue
		}
		now := m.clock()
		r := &Row{
			Message: Message{
				ID: msg.ID, Type: msg.Type, Payload: msg.Payload, Headers: msg.Headers,
				TenantID: msg.TenantID, IdempotencyKey: msg.IdempotencyKey, Topic: msg.Topic,
				OrderingKey: msg.OrderingKey,
				CreatedAt:   now, VisibleAfter: now.Add(msg.Delay.Truncate(time.Microsecond)),
			},
			Status:          StatusPending,
			Attempts:        []Attempt{},
			LeaseGeneration: m.purgedGeneration,
		}
		if msg.IdempotencyKey != "" {
			keys[key] = r
		}
		byID[msg.ID] = r
		added = append(added, r)
		inserted = append(inserted, msg.ID)
	}
	return added, enqueueResult(msgs, inserted, dups), nil
}

// insert stores rows, planned by planEnqueue, and places the keyed ones in
// their keys' lines, in order. The caller holds m.mu.
func (m *Memory) insert(rows []*Row) {
	now := m.clock()
	for _, r := range rows {
		m.rows[r.ID] = r
		if r.OrderingKey != "" {
			m.place(r, now)
		}
	}
}
