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
// The runtime over a Store (a claim loop with worker slots, a heartbeat
// that renews, a writer that batches outcomes, retries, metrics and the
// LISTEN work signal) is package leasing/processor.
package leasing
