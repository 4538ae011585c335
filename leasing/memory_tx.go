package leasing

import (
	"context"
	"fmt"
	"sync"

	"github.com/jackc/pgx/v5"
)

// Begin starts a transaction on m for the unit tests of producer code that
// enqueues in its caller's transaction (Postgres.EnqueueTx, through
// Postgres.InTx): the messages its Enqueue adds are invisible to m (Claim,
// Get, List, Stats) until Commit, and never appear after Rollback, as a
// pgx.Tx's would be. Enqueue reports duplicates against m's messages and
// those the transaction added.
//
// Unlike PostgreSQL, the transaction neither locks nor waits: a message
// another caller stores between this Enqueue and Commit that duplicates
// one of the transaction's (by id, or by tenant and idempotency key) is
// settled at Commit, where the inbox skips the transaction's message (the
// other came first) and the outbox fails the Commit.
func (m *Memory) Begin() *MemoryTx { return &MemoryTx{m: m} }

// MemoryTx is a transaction on a Memory store (Memory.Begin); it is a
// leasing.Enqueuer. Its methods are safe for concurrent use.
type MemoryTx struct {
	m    *Memory
	mu   sync.Mutex
	rows []*Row // added, in enqueue order
	done bool   // committed or rolled back
}

// Enqueue adds msgs to the transaction, as Memory.Enqueue would add them
// to the store, and reports them so.
//
// Errors: as Memory.Enqueue's, and pgx.ErrTxClosed after Commit or
// Rollback.
func (tx *MemoryTx) Enqueue(ctx context.Context, msgs ...NewMessage) (res EnqueueResult, err error) {
	m := tx.m
	msgs, err = validateMessages(m.queue, msgs)
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return EnqueueResult{}, err
	}
	_, span, msgs := m.tracing.send(ctx, m.queue, msgs)
	defer func() { endSend(span, len(res.Duplicates), err) }()
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.done {
		return EnqueueResult{}, pgx.ErrTxClosed
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	added, res, err := m.planEnqueue(msgs, tx.rows)
	if err != nil {
		return EnqueueResult{}, err
	}
	tx.rows = append(tx.rows, added...)
	return res, nil
}

// Commit makes the transaction's messages visible in the store, in
// enqueue order, keyed ones placed in their keys' lines.
//
// Errors: pgx.ErrTxClosed after Commit or Rollback; ErrDuplicate (outbox)
// or an *OrderingKeyConflictError (inbox) when a message stored since
// conflicts with one of the transaction's: then nothing is stored and the
// transaction is over.
func (tx *MemoryTx) Commit(ctx context.Context) error {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.done {
		return pgx.ErrTxClosed
	}
	tx.done = true
	m := tx.m
	m.mu.Lock()
	defer m.mu.Unlock()
	keys := map[[2]string]*Row{}
	for _, r := range m.rows {
		if r.IdempotencyKey != "" {
			keys[[2]string{r.TenantID, r.IdempotencyKey}] = r
		}
	}
	keep := make([]*Row, 0, len(tx.rows))
	for _, r := range tx.rows {
		other := m.rows[r.ID]
		if other == nil && r.IdempotencyKey != "" {
			other = keys[[2]string{r.TenantID, r.IdempotencyKey}]
		}
		switch {
		case other == nil:
			keep = append(keep, r)
		case m.queue == Outbox:
			return fmt.Errorf("%w: outbox message %s", ErrDuplicate, r.ID)
		case r.OrderingKey != "" && other.OrderingKey != r.OrderingKey:
			return &OrderingKeyConflictError{ID: r.ID}
		}
	}
	m.insert(keep)
	tx.rows = nil
	return nil
}

// Rollback drops the transaction's messages. It returns pgx.ErrTxClosed
// after Commit or Rollback, as a pgx.Tx does, so that a deferred Rollback
// after a Commit does nothing.
func (tx *MemoryTx) Rollback(ctx context.Context) error {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.done {
		return pgx.ErrTxClosed
	}
	tx.done = true
	tx.rows = nil
	return nil
}
