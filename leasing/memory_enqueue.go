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
	inserted := []uuid.UUID{}
	added := map[uuid.UUID]*Row{}
	var order []*Row // added rows in input order
	keys := map[[2]string]*Row{}
	for _, r := range m.rows {
		if r.IdempotencyKey != "" {
			keys[[2]string{r.TenantID, r.IdempotencyKey}] = r
		}
	}
	for _, msg := range msgs {
		// As the SQL: a keyed duplicate of a stored message of another
		// ordering key (or none) fails the call, before anything is inserted.
		if m.queue != Inbox || msg.OrderingKey == "" {
			continue
		}
		if r := m.rows[msg.ID]; r != nil && r.OrderingKey != msg.OrderingKey {
			return EnqueueResult{}, &OrderingKeyConflictError{ID: msg.ID}
		}
		if r := keys[[2]string{msg.TenantID, msg.IdempotencyKey}]; msg.IdempotencyKey != "" && r != nil &&
			r.OrderingKey != msg.OrderingKey {
			return EnqueueResult{}, &OrderingKeyConflictError{ID: msg.ID}
		}
	}
	for _, msg := range msgs {
		if m.rows[msg.ID] != nil || added[msg.ID] != nil {
			if m.queue == Outbox {
				return EnqueueResult{}, fmt.Errorf("%w: outbox message %s", ErrDuplicate, msg.ID)
			}
			continue
		}
		key := [2]string{msg.TenantID, msg.IdempotencyKey}
		if msg.IdempotencyKey != "" && keys[key] != nil {
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
			Status:   StatusPending,
			Attempts: []Attempt{},
		}
		if msg.IdempotencyKey != "" {
			keys[key] = r
		}
		added[msg.ID] = r
		order = append(order, r)
		inserted = append(inserted, msg.ID)
	}
	now := m.clock()
	for _, r := range order {
		m.rows[r.ID] = r
		if r.OrderingKey != "" {
			m.place(r, now)
		}
	}
	return enqueueResult(msgs, inserted), nil
}
