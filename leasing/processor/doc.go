// Package processor is the runtime over a lease store: a [Processor] claims
// due messages of one queue, runs a [Handler] on each in a bounded number of
// worker slots, renews the leases while it holds them, and writes each
// outcome under the lease's fence. One implementation serves the inbox (a
// handler) and the outbox ([Publisher.Handler]).
//
// The store is any [Store]: the handful of leasing.Store methods the
// processor calls, which *leasing.Postgres and *leasing.Memory implement. A
// store that is also a [Vacuumer] (*leasing.Postgres) has its table and its
// ordering keys' table vacuumed by the processor's [VacuumPolicy]. A [Listener] wakes a processor on the
// queue's NOTIFY channel; [RegisterQueueGauges] exports queue depth.
//
// # Lifecycle of a claimed message
//
//   - Claim: a batch of up to BatchSize is claimed whenever fewer than
//     Concurrency leases are held, at once after a full batch, else after
//     PollInterval or a WorkSignal wake; with a WorkSignal, also 2, 4, ...
//     64 ms after a claim that found work, while claims find nothing, and
//     PollInterval is the ceiling an idle processor polls at. At most Concurrency+BatchSize-1
//     leases are held; those beyond the free slots wait, FIFO. A claim call
//     is given LeaseDuration to return; after a failed one the processor
//     waits PollInterval, and for one LeaseDuration precedes each claim
//     with a ReleaseOrphans sweep: a failed claim may have committed
//     leases it never saw, which the sweep releases with their attempt
//     returned while they have not expired (an expired one may be a lease
//     this processor lost after its handler ran; it is reclaimed with its
//     attempt counted).
//   - Heartbeat: from its claim until its outcome is written, every lease
//     (waiting, running or being written) is renewed each HeartbeatInterval,
//     all of them with one Renew call whose deadline is the soonest moment
//     a lease may expire. A lease the store reports lost, that could not be
//     renewed within LeaseDuration of the last claim or renew that extended
//     it, or whose message this processor claims again under a newer
//     generation, is lost: its handler's context is cancelled with cause
//     leasing.ErrLeaseLost, lease_lost is counted, and its outcome is not
//     written (persist_skipped). The row then belongs to whoever reclaimed
//     it, or expires and is reclaimed: it stays retryable.
//   - Outcome: nil from the handler writes completed (inbox) or published
//     (outbox); an error or panic writes failed, due again after
//     RetryPolicy.Backoff(attempt) on the store's clock, with the error
//     text, or dead_lettered when the attempt is RetryPolicy.MaxAttempts or
//     later. A message claimed past MaxAttempts (its earlier attempts ended
//     without an outcome: the worker crashed) is dead-lettered with
//     [ErrAttemptsExhausted] without running the handler again. A retry
//     delay shorter than the time to the next poll brings that claim
//     forward, and so does a completion or dead letter of a keyed message,
//     which may promote the next message of its key (no work signal
//     announces it): the processor claims again as soon as a slot is free.
//     A promoted message not yet visible waits for the poll. One writer
//     writes outcomes, batching whatever is ready (one call per kind of
//     outcome); a write failing with a driver error is tried up to 5
//     times in all, with backoff (a repeated write that had committed
//     reports already_applied), then given up: the lease is no longer
//     renewed, so the row expires and is reclaimed. A write the
//     database refuses for lack of a privilege (leasing.ErrPermissionDenied)
//     is not tried again and stops the processor: Run returns that error
//     once shut down, rather than claim messages whose outcomes it cannot
//     write (before its first claim the processor checks the same, see
//     [PrivilegeChecker]). A write the fence refuses counts
//     persist_rejected. When 8 x Concurrency outcomes already wait for the
//     writer, a worker queues its own and keeps its slot until the writer
//     has taken it, so a store slow to write stops the claims.
//   - Handler timeout: a handler call that runs past HandlerTimeout (1
//     minute unless set; NoHandlerTimeout for none) has its context
//     cancelled with cause [ErrHandlerTimeout], and its attempt is written
//     at once as failed (or dead_lettered) per the RetryPolicy, as for a
//     handler error, with the text "processor: handler timed out after
//     <timeout>". From that write on the lease is not renewed, and what the
//     handler returns is not written. A handler that ignores its context
//     keeps its worker slot until it returns; its message may meanwhile be
//     claimed again once its retry delay ends.
//   - Shutdown (context cancelled or Stop): claiming stops; leases whose
//     handler has not started are released at once (Release: due again at
//     once, attempt returned); running handlers get ShutdownGrace, then
//     their contexts are cancelled with cause [ErrShutdown]. A handler that
//     returns an error after that cancel is written as failed with no retry
//     delay and ErrShutdown's text: the attempt counts, but a shutdown never
//     dead-letters, the next attempt decides. One that returns nil is
//     written as succeeded.
//   - Vacuum: on a [Vacuumer] store the processor runs [KeepVacuumed] with
//     its Vacuum policy while it runs: VACUUM of the queue's table, and
//     of its ordering keys' table (with ANALYZE), once enough rows died in
//     it, so that claims and key lookups do not read ever more dead
//     entries between two autovacuum visits.
//
// # Batch handlers
//
// [NewBatch] makes a processor whose [BatchHandler] receives the leases of
// one claim in one call, up to BatchSize of them, and returns one outcome
// per lease (nil or an error, as a Handler's); [BatchPublisher] is its
// outbox form. A batch is what one claim returned, less leases lost before
// the call and those dead-lettered with [ErrAttemptsExhausted]: nothing
// waits to fill a batch, so a quiet queue gives small calls at once.
// Concurrency counts handler calls, so up to Concurrency × BatchSize leases
// are held. Each lease keeps the lifecycle above: the heartbeat renews
// every lease of a running call; a lease lost during the call is not
// written (lease_lost, persist_skipped), and the call's context is
// cancelled (cause leasing.ErrLeaseLost) only once every lease of it is
// lost; the outcomes of a call go to the writer together, so they are
// written by one store call per kind of outcome. A panic, or a result
// whose length is not the number of leases ([ErrBatchLength]), fails
// every lease of the call per the RetryPolicy. HandlerTimeout bounds the
// call: past it the call's context is cancelled with [ErrHandlerTimeout]
// and every lease still held is written failed at once. Shutdown cancels
// the call's context with [ErrShutdown] after ShutdownGrace and writes
// its errors without a retry delay, as for a Handler. handler_duration
// records one value per call, outcome error when any lease's outcome is
// an error; "handler panicked" and "handler timed out" are logged once per
// call, with count and message_ids instead of one lease's attributes.
//
// # Clocks
//
// Lease expiry and visibility are the store's clock (the database's for
// *leasing.Postgres). The processor uses its own monotonic clock only for
// its timers and to bound each lease locally at LeaseDuration from the
// moment it sent the claim or renew that set the expiry, which is never
// later than the store's expiry.
//
// # Counters
//
// Counters on Options.Meter (Int64Counter, unit {message}), named
// litebus.<queue>.processor.<name> ([MetricName]): leases_acquired,
// lease_lost, succeeded (inbox) or published (outbox; [SucceededCounter]),
// failed, dead_lettered, persist_skipped, persist_rejected, and parked:
// messages a claim could not lease (a counter at its limit, a non-finite
// time, headers that are not a JSON object) and dead-lettered instead,
// each claim that parked any also reported to OnError as a
// *leasing.ParkedError (see leasing.Store.Claim); its leases are worked as
// usual.
//
// # Histograms
//
// Histograms on Options.Meter (Float64Histogram, unit s), named
// litebus.<queue>.processor.<name>, each with explicit bucket boundaries
// (a MeterProvider view may replace them):
//
//   - handler_duration: one handler call, from its start on a worker to its
//     return (also when HandlerTimeout wrote the attempt earlier), attribute
//     outcome = success (nil) or error (an error or a panic); a message
//     dead-lettered with ErrAttemptsExhausted runs no handler and records
//     none. Buckets 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
//     1, 2.5, 5, 10, 30, 60, 120, 300: an in-memory update to work near and
//     past the 1-minute DefaultHandlerTimeout.
//   - queue_lag: per claimed lease, from the moment the message became due
//     (leasing.Lease.DueAt: the later of its creation and its visible_after,
//     or the expiry of the lease a reclaim took over) to the claim, both on
//     the store's clock. Buckets 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
//     0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600: a woken processor claims
//     within milliseconds, a polling one within PollInterval (1 second by
//     default); beyond that, a backlog.
//   - claim_duration: one Claim call, as the processor timed it (failed
//     calls included). write_duration: one outcome-write call (each try),
//     attribute operation = release, complete, fail or dead_letter. Buckets
//     0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
//     2.5, 5, 10, 30: a round trip and a commit take under a millisecond
//     locally and a few across a network; seconds mean lock waits (up to
//     leasing.DefaultLockTimeout, 5 seconds) or a call cut off at
//     LeaseDuration.
//
// # Logging
//
// Options.Logger and ListenerOptions.Logger take a *slog.Logger; nil (the
// default) logs nothing. Records carry queue and owner (a listener's,
// queue and channel), and where they concern one lease message_id,
// attempt and generation; error holds the error, or the error text
// written with an outcome ([LogKeyQueue] and the other LogKey constants).
// A message that succeeds logs nothing at info or above. The events:
//
//   - warn: "claim failed", "message parked by the claim" (error holds
//     the reason), "orphan sweep failed", "renew failed", "lease lost",
//     "handler timed out" (timeout), "outcome write failed; retrying"
//     (try), "privilege check failed; trying again before claiming",
//     "outcome not written: the lease fence refused it" (operation,
//     outcome), "message dead-lettered", "vacuum failed", "vacuum not
//     allowed; the table is left to autovacuum", "listener connection
//     lost; reconnecting" (backoff);
//   - error: "handler panicked" (stack), "gave up writing outcomes"
//     (operation, count, message_ids), "not running: the store's role
//     lacks privileges", "stopping: the database refused an outcome write
//     for lack of a privilege", "batch handler returned the wrong
//     number of outcomes" (count, message_ids, outcomes), "listener
//     stopped: notifications do not arrive";
//   - info: "listener connected" (backend_pid), after every LISTEN that
//     delivers, so also after each reconnect;
//   - debug: "attempt failed; retry scheduled" (retry_after), "vacuum ran"
//     (table, dead_rows, duration; one record per table vacuumed: the
//     queue's, its ordering keys').
//
// Errors go to OnError as well, as before.
//
// # Tracing
//
// Options.TracerProvider takes an OpenTelemetry trace.TracerProvider (your
// SDK's); nil (the default) starts no span. No global provider or
// propagator is read. With leasing.PostgresOptions.TracerProvider (or
// MemoryOptions') set on the producer's store, each Enqueue, EnqueueTx and
// EnqueueCopy starts a "send <queue>" span (kind producer, a child of the
// caller's span) and stores its W3C trace context in each message's
// headers, traceparent and tracestate; a message that has either header
// (a string) already keeps its headers, and the send span links to the
// context they carry (leasing.MaxSendLinks). leasing.Message.SpanContext
// reads it back.
// Spans follow the OpenTelemetry messaging conventions, with
// messaging.system "leasestore", messaging.destination.name the queue and
// messaging.client.id the processor's lease owner; the attributes of
// leasestore's own are in the messaging.leasestore namespace, as the
// conventions ask of a system's attributes:
//
//   - "claim <queue>" (client, a root, messaging.operation.type
//     receive): one per claim that took or parked messages or failed, so
//     an idle processor's polls trace nothing;
//     messaging.leasestore.claim.batch_size,
//     messaging.batch.message_count (leases),
//     messaging.leasestore.parked, a link to each lease's enqueue span.
//   - "process <queue>" (consumer, type process): one per attempt, a
//     child of the claim that leased the message and linked (not
//     parented) to its enqueue span, so a retry is a new span linked to
//     the same producer. The handler's context carries it: start your
//     spans from that context, and inject it into what a Publisher sends
//     on. Attributes messaging.message.id, messaging.message.body.size,
//     messaging.leasestore.attempt,
//     messaging.leasestore.lease.generation,
//     messaging.leasestore.tenant_id, messaging.leasestore.message.type,
//     messaging.leasestore.topic and messaging.leasestore.ordering_key
//     (those four when not empty). It ends once the attempt's outcome is
//     written, with messaging.leasestore.outcome = succeeded (published
//     on the outbox: the word of SucceededCounter), failed,
//     dead_lettered or lost (nothing written),
//     messaging.leasestore.write.outcome the store's leasing.Outcome,
//     status error unless it succeeded, and error.type handler_error,
//     panic (the panic recorded as an exception event), timeout (a
//     "handler timed out" event), attempts_exhausted, shutdown or
//     lease_lost.
//   - "process <queue>" of a batch call (internal, type process): with
//     [NewBatch] each lease still gets its process span as above,
//     started as its call starts (one dead-lettered with
//     ErrAttemptsExhausted gets one without a call; error.type
//     batch_length for a result of the wrong length). The call is one
//     more span, a sibling of those under the same claim, carried by the
//     BatchHandler's context: messaging.batch.message_count,
//     messaging.leasestore.batch.failed (outcomes that are errors) and a
//     link to each lease's process span, the link carrying
//     messaging.message.id. It ends when the call returns, status error
//     with error.type panic, batch_length or timeout (a "handler timed
//     out" event; only when the timeout failed a lease still held, not
//     when all were lost first) when the whole call failed; one lease's
//     error is on that lease's span only. The conventions let a batch's process span
//     link to each message's creation context; the lease spans hold
//     those links, so the call's span links to them: one link per lease
//     (an SDK keeps 128 a span by default), and the consumer spans
//     linked to producers stay the leases' (hence kind internal). To
//     pass a message's trace on, inject l.Message.SpanContext() or start
//     spans linked to it.
//   - "renew <queue>" (client, a root): one per Renew call of the
//     heartbeat; messaging.batch.message_count,
//     messaging.leasestore.renew.renewed,
//     messaging.leasestore.renew.lost.
//   - "complete|fail|dead_letter|release <queue>" (client, a root, type
//     settle): one per outcome write, its tries included (a failed try
//     is a "write failed" event); messaging.batch.message_count,
//     messaging.leasestore.write.succeeded,
//     messaging.leasestore.write.rejected, a link to each attempt's
//     process span.
//
// The processor's spans come from the tracer of instrumentation scope
// TracerName, "github.com/leasestore/leasestore/leasing/processor"; the
// stores' send spans from leasing.TracerName,
// "github.com/leasestore/leasestore/leasing". Filter, sample or route them
// by scope. A sampler decides as usual: the process spans of a claim
// follow the claim span's decision (their parent), not the producer's.
package processor
