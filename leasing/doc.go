// Package leasing lets processor workers claim due rows of a PostgreSQL inbox
// or outbox table, hold them under a time-bounded lease, renew that lease
// while a handler runs, and write the outcome under the lease's fence.
//
// A [Store] serves one [Queue]. [Postgres] is the production store over the
// sqlc queries in gen/; [Memory] is an in-process twin with the same
// semantics for unit tests. Both pass the contract suite in leasingtest.
//
// Every claim bumps the row's lease generation (the fencing token). Renew,
// Release, Complete, Fail and DeadLetter only change rows whose lease owner,
// generation and in-flight status still match the [Lease] the caller holds;
// a worker whose lease was reclaimed learns it from the per-message
// [Outcome] and can no longer write. Visibility, expiry and renewal are
// computed from the store's clock: the database's for [Postgres], never the
// caller's.
//
// With a TracerProvider in [PostgresOptions] or [MemoryOptions], an
// enqueue starts a "send <queue>" span and stores its W3C trace context
// in each message's headers ([HeaderTraceParent]); [Message.SpanContext]
// reads it back, and the processor links each attempt's span to it.
//
// # Ordering keys
//
// A message enqueued with NewMessage.OrderingKey joins the line of its key
// (scoped by tenant: the same key in two tenants is two keys). Only the
// key's head, its first unfinished message, can be claimed; the messages
// behind it are StatusWaiting. A claim of N therefore returns at most one
// message per key, and no two leases are ever live on two messages of one
// key. The head keeps its key while it is pending, leased (also after its
// lease expired and until it is reclaimed), failed and waiting out its
// backoff, or released. When it finishes (completed, published, or
// dead-lettered), the next message of its key becomes pending, in the same
// transaction as the write.
//
// The order is the key's enqueue order: within one Enqueue call, slice
// order; across calls, the order in which their transactions committed
// (concurrent enqueues of one key serialise on the key's row). Callers that
// enqueue one key's messages from sequential transactions (as writes to one
// aggregate usually are) get them in created_at order.
//
// Dead letters: by default a dead-lettered head frees its key. With strict
// ordering (SetStrictOrdering, per queue, stored in the database so that
// every process agrees) it keeps the key blocked until it is requeued (it
// is then the key's head again) or purged (the next message is promoted).
// A requeued dead letter that does not hold its key rejoins the key's line
// at its tail.
//
// Costs: a keyed enqueue runs a second statement (its rows' places, one
// upsert per key); a Complete or DeadLetter of keyed leases runs two more
// statements in the same round trip and transaction (free the keys, then
// promote; one index descent per key). The store tells keyed leases by
// Lease.Message.OrderingKey: pass leases back unchanged. An EnqueueTx of a
// keyed message holds its key's row until the caller's transaction ends;
// finishing that key's head waits for it (PostgresOptions.LockTimeout),
// and fails with ErrLockTimeout past it, with every other outcome of the
// same call (the processor then writes the others without that key).
//
// The runtime over a Store (a claim loop with worker slots, a heartbeat
// that renews, a writer that batches outcomes, retries, metrics and the
// LISTEN work signal) is package leasing/processor.
package leasing
