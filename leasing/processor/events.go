package processor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/leasestore/leasestore/leasing"
)

// events is a processor's one event sink: each method is one event of the
// run and fans it out to the metrics, the log records, the spans and
// Options.OnError, so that the loop, the workers, the heartbeat and the
// writer make one call per event. Metric, log and span names are listed in
// docs/processor.md.
type events struct {
	m       *metrics
	log     logger // writes nothing without Options.Logger
	t       tracer // starts no span without Options.TracerProvider
	onError func(error)
	queue   leasing.Queue
	claim   leasing.ClaimRequest
	batch   bool          // NewBatch: log a call's leases by count and ids
	timeout time.Duration // Options.HandlerTimeout
	health  *health       // what Processor.Health reports
}

func newEvents(opts Options, q leasing.Queue, claim leasing.ClaimRequest, batch bool) (*events, error) {
	m, err := newMetrics(opts.Meter, q)
	if err != nil {
		return nil, err
	}
	return &events{
		m: m, log: newLogger(opts.Logger, q, claim.Owner), t: newTracer(opts.TracerProvider, q, claim.Owner),
		onError: opts.OnError, queue: q, claim: claim, batch: batch, timeout: opts.HandlerTimeout,
		health: newHealth(q, claim.Owner),
	}, nil
}

// report hands err to OnError, when set.
func (e *events) report(err error) {
	if e.onError != nil {
		e.onError(err)
	}
}

// errorf returns an error of the queue, "processor: <queue> <what>: <err>".
func (e *events) errorf(what string, err error) error {
	return fmt.Errorf("processor: %s %s: %w", e.queue, what, err)
}

// claimed records a claim sent at sent that returned leases and parked
// pe's rows, or failed with err, and returns base with the claim's span:
// the parent of the leases' process spans.
func (e *events) claimed(base context.Context, sent time.Time, leases []leasing.Lease, pe *leasing.ParkedError, err error) context.Context {
	e.m.observeClaim(time.Since(sent), leases, e.claim.LeaseFor)
	parked := 0
	if pe != nil {
		parked = len(pe.Parked)
		e.report(e.errorf("claim", pe))
		for _, r := range pe.Parked {
			e.log.log(slog.LevelWarn, "message parked by the claim",
				slog.String(LogKeyMessageID, r.ID.String()), slog.String(LogKeyError, r.Reason))
		}
		if pe.KeysNotFreed != nil {
			e.log.log(slog.LevelError, "ordering keys of parked messages not freed: requeue or purge them",
				slog.Int("parked", len(pe.Parked)), errAttr(pe.KeysNotFreed))
		}
		count(e.m.parked, parked)
	}
	if err != nil {
		e.t.claimed(base, sent, e.claim, nil, 0, err)
		e.report(e.errorf("claim", err))
		e.log.log(slog.LevelWarn, "claim failed", errAttr(err))
		return base
	}
	count(e.m.acquired, len(leases))
	e.health.claimed()
	return e.t.claimed(base, sent, e.claim, leases, parked, nil)
}

// privilegesMissing records err, the *leasing.PrivilegeError of the check
// before the first claim, and returns the error Run returns.
func (e *events) privilegesMissing(err error) error {
	err = e.errorf("refuses to run", err)
	e.health.set(StatePrivilegesRefused, err)
	e.report(err)
	e.log.log(slog.LevelError, "not running: the store's role lacks privileges", errAttr(err))
	return err
}

// privilegeCheckFailed records a privilege check that could not tell.
func (e *events) privilegeCheckFailed(err error) {
	e.health.set(StateStarting, err)
	e.report(e.errorf("check privileges", err))
	e.log.log(slog.LevelWarn, "privilege check failed; trying again before claiming", errAttr(err))
}

// schemaBehind records se, the schema check's finding that the database
// lacks what this version needs: logged (error) and reported once per
// finding, not at every check.
func (e *events) schemaBehind(se *leasing.SchemaError) {
	if !e.health.set(StateSchemaBehind, se) {
		return
	}
	e.report(e.errorf("waits for the schema", se))
	e.log.log(slog.LevelError, "not claiming: the database schema is behind this version; run leasectl migrate up (or db.MigrateUp)", errAttr(se))
}

// running records that the processor claims: the start checks passed.
func (e *events) running() {
	was := e.health.get().State
	if e.health.set(StateRunning, nil) && was == StateSchemaBehind {
		e.log.log(slog.LevelInfo, "the database schema is ready; claiming")
	}
}

// instanceRefused records err, a *leasing.InstanceInUseError, and returns
// the error Run returns.
func (e *events) instanceRefused(err error) error {
	err = e.errorf("refuses to run", err)
	e.health.set(StateInstanceInUse, err)
	e.report(err)
	e.log.log(slog.LevelError, "not running: another live process holds this instance id", errAttr(err))
	return err
}

// instanceStepFailed records a failed try of an instance step (what:
// "lock instance", "expire previous leases"), tried again.
func (e *events) instanceStepFailed(what string, err error) {
	if se := schemaBehind(err); se != nil {
		e.schemaBehind(se)
		return
	}
	e.health.set(StateStarting, err)
	e.report(e.errorf(what, err))
	e.log.log(slog.LevelWarn, what+" failed; trying again", errAttr(err))
}

// tookOver records the leases of earlier incarnations that ExpirePrevious
// ended, for the next claims to reclaim.
func (e *events) tookOver(ids []uuid.UUID) {
	if len(ids) > 0 {
		e.log.log(slog.LevelInfo, "ended the leases of an earlier incarnation of this instance; reclaiming them", slog.Int("leases", len(ids)))
	}
}

// instanceLockLost records that the instance lock's session ended (err);
// the processor goes on and takes the lock again.
func (e *events) instanceLockLost(err error) {
	e.report(e.errorf("instance lock", err))
	e.log.log(slog.LevelWarn, "instance lock lost; taking it again", errAttr(err))
}

// listenerFailed records an error of the processor's own Listener.
func (e *events) listenerFailed(err error) {
	e.health.listener(err)
	e.report(e.errorf("listener", err))
}

// vacuumFailed reports a failed VacuumIfDead to OnError, but
// leasing.ErrVacuumNotAllowed: a least-privilege role (db/roles.sql before
// PostgreSQL 17) may not vacuum, which the vacuumer logs once at info.
func (e *events) vacuumFailed(err error) {
	if !errors.Is(err, leasing.ErrVacuumNotAllowed) {
		e.report(err)
	}
}

// retentionFailed records a failed retention run, reported to OnError;
// stopping: the role may not DELETE, and retention stops.
func (e *events) retentionFailed(err error, stopping bool) {
	e.report(e.errorf("retention", err))
	if stopping {
		e.log.log(slog.LevelError, "retention stopped: the role may not DELETE; run the processor as a member of leasestore_operator, or schedule leasectl purge", errAttr(err))
		return
	}
	e.log.log(slog.LevelWarn, "retention failed; trying again at the next run", errAttr(err))
}

// retentionRan logs what one retention run purged (debug), when it
// purged rows.
func (e *events) retentionRan(total leasing.RetentionResult) {
	if total.Finished+total.DeadLettered > 0 {
		e.log.log(slog.LevelDebug, "retention purged rows", slog.Int("finished", total.Finished), slog.Int("dead_lettered", total.DeadLettered))
	}
}

// sweepFailed records a failed orphan sweep.
func (e *events) sweepFailed(err error) {
	e.report(e.errorf("release orphans", err))
	e.log.log(slog.LevelWarn, "orphan sweep failed", errAttr(err))
}

// processStarted starts h's process span for the attempt on lease and
// returns h's context with it. h.span is set before the handler's timeout
// starts and read after its outcome is submitted.
func (e *events) processStarted(h *heldLease, lease leasing.Lease) context.Context {
	ctx, span := e.t.startProcess(h.ctx, lease)
	h.span = span
	return ctx
}

// handlerDone records, deferred from a handler call started at start,
// its handler_duration with the result of *err.
func (e *events) handlerDone(start time.Time, err *error) { e.m.observeHandler(start, err) }

// handlerReturned records that h's handler returned err, whose outcome is
// about to be written.
func (e *events) handlerReturned(h *heldLease, err error) { handlerReturned(h.span, err) }

// handlerPanicked records the panic v, with stack, of a call over leases.
func (e *events) handlerPanicked(leases []leasing.Lease, v any, stack []byte) {
	if e.log.enabled(slog.LevelError) {
		e.log.log(slog.LevelError, "handler panicked", e.callAttrs(leases,
			slog.String(LogKeyError, fmt.Sprint(v)), slog.String("stack", string(stack)))...)
	}
}

// handlerTimedOut records a handler call (span, nil for New) that ran past
// HandlerTimeout while hs, holding leases, still ran.
func (e *events) handlerTimedOut(span trace.Span, hs []*heldLease, leases []leasing.Lease) {
	for _, h := range hs {
		handlerTimedOutSpan(h.span, e.timeout)
	}
	handlerTimedOutSpan(span, e.timeout)
	if e.log.enabled(slog.LevelWarn) {
		e.log.log(slog.LevelWarn, "handler timed out", e.callAttrs(leases, slog.Duration("timeout", e.timeout))...)
	}
}

// batchStarted starts the span of a batch call over hs.
func (e *events) batchStarted(base context.Context, hs []*heldLease) (context.Context, trace.Span) {
	return e.t.startBatch(base, hs)
}

// batchEnded ends the span of a batch call that returned errs.
func (e *events) batchEnded(span trace.Span, errs []error, timedOut bool) {
	endBatch(span, errs, timedOut)
}

// batchWrongLength records a batch call that returned got outcomes for
// leases.
func (e *events) batchWrongLength(leases []leasing.Lease, got int) {
	if e.log.enabled(slog.LevelError) {
		e.log.log(slog.LevelError, "batch handler returned the wrong number of outcomes",
			batchAttrs(leases, slog.Int("outcomes", got))...)
	}
}

// leaseLost records h given up as lost.
func (e *events) leaseLost(h *heldLease) {
	count(e.m.lost, 1)
	e.log.log(slog.LevelWarn, "lease lost", leaseAttrs(*h.lease)...)
}

// skipped records an outcome not written because its lease was lost.
func (e *events) skipped() { count(e.m.skipped, 1) }

// processLost ends the process span of h, whose lease was lost.
func (e *events) processLost(h *heldLease) { endLost(h.span) }

// renewStarted starts the span of a Renew of n leases.
func (e *events) renewStarted(ctx context.Context, n int) (context.Context, trace.Span) {
	return e.t.startRenew(ctx, n)
}

// renewed records a Renew of n leases that returned res or err; stopping
// says the heartbeat was stopping, which explains the error.
func (e *events) renewed(span trace.Span, n int, res leasing.RenewResult, lost int, err error, stopping bool) {
	endRenew(span, res, lost, err)
	if err != nil && !stopping {
		e.report(e.errorf("renew", err))
		e.log.log(slog.LevelWarn, "renew failed", slog.Int("leases", n), errAttr(err))
	}
}

// writeStarted starts the span of the write of g and returns call wrapped
// to run in it, to time each try and to record failed tries on the span.
func (e *events) writeStarted(kind writeKind, g []pendingWrite, call storeWrite) (trace.Span, storeWrite) {
	span, call := e.t.startWrite(kind, g, call)
	return span, e.m.timedWrite(kind, call)
}

// writeTryFailed records a failed outcome-write try, tried again.
func (e *events) writeTryFailed(try int, err error) {
	e.report(e.errorf(fmt.Sprintf("outcome write, try %d", try), err))
	e.log.log(slog.LevelWarn, "outcome write failed; retrying", slog.Int("try", try), errAttr(err))
}

// writeAbandoned records a write that failed with err and whose outcomes
// are written again by other writes, each with a span of its own: a write
// that timed out on a key's lock, written again in parts
// (writer.writeGroup), or completions that went with a claim that failed,
// given back to the writer (run.completeAndClaim). again says how, for the
// write's span status.
func (e *events) writeAbandoned(span trace.Span, again string, err error) {
	e.t.abandonWrite(span, again, err)
	e.writeTryFailed(1, err)
}

// written records the write of g, outcomes of kind, that reported res or
// was given up with err: the write's span and g's process spans end, the
// outcomes are counted and logged.
func (e *events) written(span trace.Span, kind writeKind, g []pendingWrite, res leasing.WriteResult, err error) {
	e.t.endWrite(span, g, res, err)
	if err != nil {
		e.writeGaveUp(kind, g, err)
		if errors.Is(err, leasing.ErrPermissionDenied) {
			e.log.log(slog.LevelError, "stopping: the database refused an outcome write for lack of a privilege", errAttr(err))
		}
		return
	}
	e.logWritten(kind, g, res)
	e.health.wrote()
	done := 0
	for _, o := range res.Outcomes {
		if o.Outcome.Succeeded() {
			done++
		}
	}
	count(e.m.rejected, len(g)-done)
	switch kind {
	case writeComplete, writeCommitted:
		count(e.m.succeeded, done)
	case writeFail:
		count(e.m.failed, done)
	case writeDeadLetter:
		count(e.m.deadLettered, done)
	case writeReleaseAfter:
		count(e.m.released, done)
	}
}

func (e *events) writeGaveUp(kind writeKind, g []pendingWrite, err error) {
	e.report(e.errorf(fmt.Sprintf("gave up writing %d outcomes", len(g)), err))
	if !e.log.enabled(slog.LevelError) {
		return
	}
	ids := make([]string, len(g))
	for i, pw := range g {
		ids[i] = pw.failure.Lease.Message.ID.String()
	}
	e.log.log(slog.LevelError, "gave up writing outcomes", slog.String("operation", writeOperations[kind]),
		slog.Int("count", len(g)), slog.Any("message_ids", ids), errAttr(err))
}

// logWritten logs each dead letter (error), each failure and each
// release by a verdict (warn: once per message and attempt, as the write
// is applied once), and each outcome the fence refused (warn).
func (e *events) logWritten(kind writeKind, g []pendingWrite, res leasing.WriteResult) {
	for i, o := range res.Outcomes {
		if i >= len(g) {
			break
		}
		f := g[i].failure
		switch {
		case !o.Outcome.Succeeded():
			e.log.log(slog.LevelWarn, "outcome not written: the lease fence refused it", leaseAttrs(f.Lease,
				slog.String("operation", writeOperations[kind]), slog.String("outcome", string(o.Outcome)))...)
		case o.Outcome != leasing.OutcomeApplied:
			// already applied by this lease: logged when it was
		case kind == writeDeadLetter:
			e.log.log(slog.LevelError, "message dead-lettered", leaseAttrs(f.Lease,
				slog.String(LogKeyVerdict, g[i].verdict.String()), slog.String(LogKeyError, f.Error))...)
		case kind == writeFail:
			e.log.log(slog.LevelWarn, "attempt failed; retry scheduled", leaseAttrs(f.Lease,
				slog.Duration("retry_after", f.RetryAfter), slog.String(LogKeyError, f.Error))...)
		case kind == writeReleaseAfter:
			e.log.log(slog.LevelWarn, "attempt failed; released without spending it", leaseAttrs(f.Lease,
				slog.String(LogKeyVerdict, g[i].verdict.String()), slog.Duration("retry_after", f.RetryAfter),
				slog.String(LogKeyError, f.Error))...)
		}
	}
}

// breakerChanged records the breaker of topic entering state, after
// unavailable consecutive Unavailable verdicts when it opens: gauge,
// transition counter and a warn record.
func (e *events) breakerChanged(topic string, state BreakerState, unavailable int) {
	e.m.observeBreaker(topic, state)
	if state == BreakerOpen {
		e.log.log(slog.LevelWarn, "breaker opened: claims of the topic stop, one message probes the destination",
			slog.String(LogKeyTopic, topic), slog.Int("unavailable", unavailable))
		return
	}
	e.log.log(slog.LevelWarn, "breaker closed: the destination answered, claims resume", slog.String(LogKeyTopic, topic))
}

// callAttrs are the log attributes of the leases of one handler call:
// the lease's for New, the count and ids for NewBatch.
func (e *events) callAttrs(leases []leasing.Lease, extra ...slog.Attr) []slog.Attr {
	if !e.batch {
		return leaseAttrs(leases[0], extra...)
	}
	return batchAttrs(leases, extra...)
}

// schemaBehind returns err as a *leasing.SchemaError, or nil when it is
// not one.
func schemaBehind(err error) *leasing.SchemaError {
	se := (*leasing.SchemaError)(nil)
	if errors.As(err, &se) {
		return se
	}
	return nil
}
