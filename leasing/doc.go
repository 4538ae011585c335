// Package leasing lets workers claim due rows of a PostgreSQL inbox or
// outbox table, hold each under a time-bounded lease, renew it while a
// handler runs, and write the result under the lease's fence. The
// [README] walks through it; [Operations] and [Observability] cover
// running it.
//
// The parts:
//
//   - Vocabulary: a [Queue] (inbox or outbox) of rows in a [Status];
//     a [NewMessage] is enqueued, a claim returns a [Lease] on a
//     [Message], [Store.Get] returns the stored [Row] with its [Attempt]
//     history, and writes report a [WriteResult] of one [Outcome] per
//     lease. Requests, results and errors each have their own file.
//   - [Store], the interface both stores implement. Its doc states the
//     error contract once; the contract suite in leasingtest checks it.
//   - [Postgres], the production store over the sqlc queries in gen/
//     (postgres*.go), and [Memory], an in-process twin with the same
//     semantics for tests (memory*.go). A fuzzer holds the two together.
//   - The runtime over a Store (claim loop, worker slots, heartbeat,
//     batched writes, retries, metrics) is package leasing/processor.
//
// Every claim bumps the row's lease generation, the fencing token; a write
// changes a row only while its owner, generation and in-flight status
// still match the [Lease], so a worker whose lease was reclaimed learns it
// from the [Outcome] and can no longer write. Visibility, expiry and
// renewal follow the store's clock, the database's for [Postgres]. With a
// TracerProvider, an enqueue's span context travels in the message's
// headers ([HeaderTraceParent]).
//
// A message with an ordering key waits (StatusWaiting) until every earlier
// message of its key has finished, so that one key's messages run one at
// a time in enqueue order: see [Ordering keys].
//
// [README]: https://github.com/leasestore/leasestore#readme
// [Operations]: https://github.com/leasestore/leasestore/blob/main/docs/operations.md
// [Observability]: https://github.com/leasestore/leasestore/blob/main/docs/observability.md
// [Ordering keys]: https://github.com/leasestore/leasestore#ordering-keys
package leasing
