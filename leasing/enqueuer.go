package leasing

import "context"

// Enqueuer adds messages to one queue. Producer code that takes an
// Enqueuer runs on every store the same way: a Store (Enqueue in a
// transaction of its own), a Postgres store bound to the caller's
// transaction (Postgres.InTx: the transactional outbox), and, in unit
// tests without PostgreSQL, a Memory transaction (Memory.Begin), whose
// messages the Memory store shows only once it commits.
type Enqueuer interface {
	// Enqueue adds msgs as Store.Enqueue does, with its errors.
	Enqueue(ctx context.Context, msgs ...NewMessage) (EnqueueResult, error)
}

var (
	_ Enqueuer = Store(nil)
	_ Enqueuer = (*MemoryTx)(nil)
)
