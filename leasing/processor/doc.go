// Package processor is the runtime over a lease store: a [Processor] claims
// due messages of one queue, runs a [Handler] on each in a bounded number of
// worker slots, renews the leases while it holds them, and writes each
// outcome under the lease's fence. One implementation serves the inbox (a
// handler) and the outbox ([Publisher.Handler]); [NewBatch] passes the
// leases of one claim to a [BatchHandler] in one call.
//
// The store is any [Store]: the few leasing.Store methods the processor
// calls, which *leasing.Postgres and *leasing.Memory implement. A store that
// is also a [Vacuumer] has its tables vacuumed by the [VacuumPolicy]; one
// that is a [PrivilegeChecker] is checked before the first claim. A
// [WorkSignal], such as a *leasing.Listener, wakes the processor before its
// poll interval ends; [RegisterQueueGauges] exports queue depth.
//
// In short: a lease is renewed by the heartbeat from its claim until its
// outcome is written. A lost lease cancels its handler (cause
// leasing.ErrLeaseLost) and its outcome is not written. A nil return writes
// the queue's success state, an error or a panic writes failed (due again
// after [RetryPolicy.Backoff]) or dead_lettered at MaxAttempts; an error
// wrapped with a verdict says more: [Permanent] dead-letters at once,
// [RetryAfter] and [Unavailable] release the message without spending its
// attempt, and consecutive Unavailable verdicts open the [BreakerPolicy]'s
// breaker for the message's topic, which then only probes it. Each retry is
// claimed when its delay ends, whatever else wakes the loop. A handler
// past HandlerTimeout is cancelled ([ErrHandlerTimeout]) and its attempt
// written failed at once. Shutdown releases unstarted leases and gives
// running handlers ShutdownGrace before cancelling them ([ErrShutdown]).
// Lease expiry and visibility are the store's clock; the processor's own
// clock only bounds each lease locally, never past the store's expiry.
//
// Errors the processor retries go to Options.OnError; Options.Meter,
// Options.Logger and Options.TracerProvider receive its metrics (named
// litebus.<queue>.processor.<name>, see [MetricName]), its slog records
// (keys [LogKeyQueue] and the other LogKey constants) and its spans
// (scope [TracerName]). Nil providers record nothing.
//
// The lifecycle in full, and every metric, log record and span:
// https://github.com/leasestore/leasestore/blob/main/docs/processor.md.
// Wiring the providers: docs/observability.md; running in production:
// docs/operations.md.
package processor
