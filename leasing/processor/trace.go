package processor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/leasestore/leasestore/leasing"
)

// TracerName is the instrumentation scope of the processor's spans; the
// stores' send spans have leasing.TracerName.
const TracerName = instrumentationScope

// instrumentationScope names the processor's tracer and its no-op meter.
const instrumentationScope = "github.com/leasestore/leasestore/leasing/processor"

// Span attribute keys beyond the OpenTelemetry messaging conventions'
// (messaging.system, messaging.operation.name and .type,
// messaging.destination.name, messaging.message.id, messaging.client.id,
// messaging.batch.message_count, error.type); docs/processor.md, Tracing,
// lists which span carries which.
const (
	attrAttempt       = "messaging.leasestore.attempt"          // int: Lease.Attempt, 1 on the first delivery
	attrGeneration    = "messaging.leasestore.lease.generation" // int: Lease.Generation, the fence
	attrTenant        = "messaging.leasestore.tenant_id"        // string, when not empty
	attrType          = "messaging.leasestore.message.type"     // string, when not empty
	attrTopic         = "messaging.leasestore.topic"            // string: the outbox topic, when not empty
	attrOrderingKey   = "messaging.leasestore.ordering_key"     // string: the message's ordering key, when not empty
	attrProcessResult = "messaging.leasestore.process.result"   // string: processResult*
	attrWriteResult   = "messaging.leasestore.write.outcome"    // string: the store's leasing.Outcome of the outcome write
	attrBatchSize     = "messaging.leasestore.claim.batch_size" // int: the most messages the claim asked for
	attrParked        = "messaging.leasestore.parked"           // int: rows the claim parked
	attrApplied       = "messaging.leasestore.write.succeeded"  // int: writes applied or already applied
	attrRejected      = "messaging.leasestore.write.rejected"   // int: writes the fence refused
	attrRenewed       = "messaging.leasestore.renew.renewed"    // int: leases renewed
	attrLost          = "messaging.leasestore.renew.lost"       // int: leases the renew found lost, given up
	attrSettled       = "messaging.leasestore.renew.settled"    // int: leases the renew found gone that their own outcome write finished or is writing
	attrFailed        = "messaging.leasestore.batch.failed"     // int: outcomes of a batch call that are errors
	attrErrorType     = "error.type"
)

// The messaging.leasestore.process.result values of a process span: how the
// attempt ended. A success is the word of the queue's success counter
// (SucceededCounter): processResultSucceeded on the inbox,
// processResultPublished on the outbox.
const (
	processResultSucceeded    = "succeeded"     // the inbox's success state was written
	processResultPublished    = "published"     // the outbox's success state was written
	processResultFailed       = "failed"        // failed was written, due again after the backoff
	processResultDeadLettered = "dead_lettered" // dead_lettered was written
	processResultReleased     = "released"      // released by a verdict, due again after a delay, attempt returned
	processResultLost         = "lost"          // the lease was lost: nothing written
)

// tracer starts a processor's spans; the zero value, a processor without
// a TracerProvider, starts none.
type tracer struct {
	t         trace.Tracer
	queue     leasing.Queue
	common    []attribute.KeyValue // messaging.system, destination and client id
	succeeded string               // the messaging.leasestore.process.result of a success on queue
}

// newTracer returns the tracer of a processor of queue q claiming as
// owner, nil tp for none.
func newTracer(tp trace.TracerProvider, q leasing.Queue, owner string) tracer {
	if tp == nil {
		return tracer{}
	}
	succeeded := processResultSucceeded
	if q == leasing.Outbox {
		succeeded = processResultPublished
	}
	return tracer{t: tp.Tracer(instrumentationScope), queue: q, succeeded: succeeded, common: []attribute.KeyValue{
		attribute.String("messaging.system", leasing.MessagingSystem),
		attribute.String("messaging.destination.name", string(q)),
		attribute.String("messaging.client.id", owner),
	}}
}

// attrs returns the common attributes, then those of operation name
// (type opType when not empty), then more.
func (t tracer) attrs(name, opType string, more ...attribute.KeyValue) []attribute.KeyValue {
	out := make([]attribute.KeyValue, 0, len(t.common)+2+len(more))
	out = append(append(out, t.common...), attribute.String("messaging.operation.name", name))
	if opType != "" {
		out = append(out, attribute.String("messaging.operation.type", opType))
	}
	return append(out, more...)
}

// claimed records the "claim <queue>" span of a claim for r sent at sent
// that returned leases and parked parked rows, or failed with err, and
// returns base carrying that span: the parent of the leases' process
// spans. The span is recorded once the claim returned, with its start
// time, and only for a claim that took or parked messages or failed, so
// an idle processor's polls trace nothing; it links to the enqueue span
// of each lease's message.
func (t tracer) claimed(base context.Context, sent time.Time, r leasing.ClaimRequest, leases []leasing.Lease, parked int, err error) context.Context {
	if t.t == nil || (len(leases) == 0 && parked == 0 && err == nil) {
		return base
	}
	attrs := t.attrs("claim", "receive", attribute.Int(attrBatchSize, r.BatchSize),
		attribute.Int("messaging.batch.message_count", len(leases)))
	if parked > 0 {
		attrs = append(attrs, attribute.Int(attrParked, parked))
	}
	if r.TenantID != "" {
		attrs = append(attrs, attribute.String(attrTenant, r.TenantID))
	}
	var links []trace.Link
	for _, l := range leases {
		if sc := l.Message.SpanContext(); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	ctx, span := t.t.Start(base, "claim "+string(t.queue), trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindClient),
		trace.WithTimestamp(sent), trace.WithAttributes(attrs...), trace.WithLinks(links...))
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
	return ctx
}

// startProcess starts the "process <queue>" span of lease, whose handler
// is about to start under ctx (the held lease's, carrying the claim's
// span: the parent), linked to the enqueue span its headers name. It
// returns ctx with the span for the handler, and the span, nil without
// tracing.
func (t tracer) startProcess(ctx context.Context, lease leasing.Lease) (context.Context, trace.Span) {
	if t.t == nil {
		return ctx, nil
	}
	m := lease.Message
	attrs := t.attrs("process", "process",
		attribute.String("messaging.message.id", m.ID.String()),
		attribute.Int(attrAttempt, lease.Attempt),
		attribute.Int64(attrGeneration, lease.Generation),
		attribute.Int("messaging.message.body.size", len(m.Payload)))
	for _, a := range []struct{ key, value string }{
		{attrTenant, m.TenantID}, {attrType, m.Type}, {attrTopic, m.Topic}, {attrOrderingKey, m.OrderingKey},
	} {
		if a.value != "" {
			attrs = append(attrs, attribute.String(a.key, a.value))
		}
	}
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...)}
	if sc := m.SpanContext(); sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	return t.t.Start(ctx, "process "+string(t.queue), opts...)
}

// handlerReturned records on a process span that the handler returned
// err, whose outcome is about to be written: an error event, and
// error.type "panic", "attempts_exhausted", "batch_length" or
// "handler_error".
func handlerReturned(span trace.Span, err error) {
	if span == nil || err == nil {
		return
	}
	kind := "handler_error"
	switch {
	case errors.Is(err, errHandlerPanicked):
		kind = "panic"
	case errors.Is(err, ErrAttemptsExhausted):
		kind = "attempts_exhausted"
	case errors.Is(err, ErrBatchLength):
		kind = "batch_length"
	}
	span.RecordError(err)
	span.SetAttributes(attribute.String(attrErrorType, kind))
}

// startBatch starts the "process <queue>" span of a batch handler call
// over hs, whose process spans have started: a child of the span of the
// claim that leased them (their handler contexts carry it; all of hs come
// from one claim), with messaging.batch.message_count and a link to each
// lease's process span, the link carrying messaging.message.id. The
// process spans link to the enqueue spans. It returns base with the span,
// for the call, and the span, nil without tracing.
func (t tracer) startBatch(base context.Context, hs []*heldLease) (context.Context, trace.Span) {
	if t.t == nil {
		return base, nil
	}
	links := make([]trace.Link, 0, len(hs))
	for _, h := range hs {
		links = append(links, trace.Link{SpanContext: h.span.SpanContext(), Attributes: []attribute.KeyValue{
			attribute.String("messaging.message.id", h.lease.Message.ID.String()),
		}})
	}
	parent := trace.ContextWithSpan(base, trace.SpanFromContext(hs[0].ctx))
	return t.t.Start(parent, "process "+string(t.queue), trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(t.attrs("process", "process", attribute.Int("messaging.batch.message_count", len(hs)))...),
		trace.WithLinks(links...))
}

// endBatch ends the span of a batch handler call that returned errs (one
// per lease, after handleBatch's checks) and ran past HandlerTimeout when
// timedOut (handlerTimedOutSpan recorded it): messaging.leasestore.batch.failed
// counts the errors; a panic or a result of the wrong length, which fail
// every lease, and a timeout make the status error.
func endBatch(span trace.Span, errs []error, timedOut bool) {
	if span == nil {
		return
	}
	failed := 0
	for _, err := range errs {
		if err != nil {
			failed++
		}
	}
	span.SetAttributes(attribute.Int(attrFailed, failed))
	switch {
	case len(errs) > 0 && (errors.Is(errs[0], errHandlerPanicked) || errors.Is(errs[0], ErrBatchLength)):
		handlerReturned(span, errs[0])
		span.SetStatus(codes.Error, errs[0].Error())
	case timedOut:
		span.SetStatus(codes.Error, ErrHandlerTimeout.Error())
	}
	span.End()
}

// handlerTimedOutSpan records on a process span that its handler ran past
// timeout: an event, and error.type "timeout". The outcome written for it
// ends the span.
func handlerTimedOutSpan(span trace.Span, timeout time.Duration) {
	if span == nil {
		return
	}
	span.AddEvent("handler timed out", trace.WithAttributes(attribute.String("timeout", timeout.String())))
	span.SetAttributes(attribute.String(attrErrorType, "timeout"))
}

// endLost ends a process span whose lease was lost: nothing is written.
func endLost(span trace.Span) {
	if span == nil {
		return
	}
	span.SetAttributes(attribute.String(attrProcessResult, processResultLost), attribute.String(attrErrorType, "lease_lost"))
	span.SetStatus(codes.Error, leasing.ErrLeaseLost.Error())
	span.End()
}

// startWrite starts the "<operation> <queue>" span of one outcome write of
// g, all of kind, under ctx (a new root), linked to the process spans of
// g. It returns the span and call wrapped to run with it in its context
// and to record each failed try as an event; the span is nil without
// tracing (call is returned as it is).
func (t tracer) startWrite(kind writeKind, g []pendingWrite, call storeWrite) (trace.Span, storeWrite) {
	if t.t == nil {
		return nil, call
	}
	var links []trace.Link
	for _, pw := range g {
		if pw.h.span != nil {
			links = append(links, trace.Link{SpanContext: pw.h.span.SpanContext()})
		}
	}
	op := writeOperations[kind]
	_, span := t.t.Start(context.Background(), op+" "+string(t.queue), trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(t.attrs(op, "settle", attribute.Int("messaging.batch.message_count", len(g)))...), trace.WithLinks(links...))
	try := 0
	return span, func(ctx context.Context) (leasing.WriteResult, error) {
		try++
		res, err := call(trace.ContextWithSpan(ctx, span))
		if err != nil {
			span.AddEvent("write failed", trace.WithAttributes(attribute.Int("try", try), attribute.String("exception.message", err.Error())))
		}
		return res, err
	}
}

// abandonWrite ends the span of an outcome write that failed with err and
// whose outcomes other writes send again (events.writeAbandoned), each
// with a span of its own; again, how, leads the span's status. The
// process spans stay open for those writes.
func (t tracer) abandonWrite(span trace.Span, again string, err error) {
	if span == nil {
		return
	}
	span.RecordError(err)
	span.SetStatus(codes.Error, again+": "+err.Error())
	span.End()
}

// endWrite ends the span of an outcome write of g that reported res or
// failed with err (given up), and the process spans of g with the outcome
// each attempt got. span is nil without tracing, and for completions that
// committed in the handler's transaction, which no write sends.
func (t tracer) endWrite(span trace.Span, g []pendingWrite, res leasing.WriteResult, err error) {
	if span != nil {
		endWriteSpan(span, len(g), res, err)
	}
	for i, pw := range g {
		if pw.h.span == nil {
			continue
		}
		var o leasing.Outcome
		if err == nil && i < len(res.Outcomes) {
			o = res.Outcomes[i].Outcome
		}
		t.endProcess(pw, o, err)
	}
}

// endWriteSpan ends the span of a write of n outcomes that reported res or
// failed with err.
func endWriteSpan(span trace.Span, n int, res leasing.WriteResult, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	} else {
		done := 0
		for _, o := range res.Outcomes {
			if o.Outcome.Succeeded() {
				done++
			}
		}
		span.SetAttributes(attribute.Int(attrApplied, done), attribute.Int(attrRejected, n-done))
	}
	span.End()
}

// endProcess ends the process span of pw's attempt, whose outcome write
// reported o or was given up with err.
func (t tracer) endProcess(pw pendingWrite, o leasing.Outcome, err error) {
	span := pw.h.span
	outcome := t.succeeded
	switch pw.kind {
	case writeFail:
		outcome = processResultFailed
		if errors.Is(context.Cause(pw.h.ctx), ErrShutdown) {
			span.SetAttributes(attribute.String(attrErrorType, "shutdown"))
		}
	case writeDeadLetter:
		outcome = processResultDeadLettered
	case writeReleaseAfter:
		outcome = processResultReleased
	}
	span.SetAttributes(attribute.String(attrProcessResult, outcome))
	switch {
	case err != nil:
		span.SetStatus(codes.Error, fmt.Sprintf("outcome %s not written: %v", outcome, err))
	case !o.Succeeded():
		span.SetAttributes(attribute.String(attrWriteResult, string(o)))
		span.SetStatus(codes.Error, fmt.Sprintf("outcome %s not written: %s", outcome, o))
	default:
		span.SetAttributes(attribute.String(attrWriteResult, string(o)))
		if pw.kind != writeComplete && pw.kind != writeCommitted {
			span.SetStatus(codes.Error, pw.failure.Error)
		}
	}
	span.End()
}

// startRenew starts the "renew <queue>" span of a Renew of n leases under
// ctx (a new root), and returns ctx with it; the span is nil without
// tracing.
func (t tracer) startRenew(ctx context.Context, n int) (context.Context, trace.Span) {
	if t.t == nil {
		return ctx, nil
	}
	return t.t.Start(ctx, "renew "+string(t.queue), trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(t.attrs("renew", "", attribute.Int("messaging.batch.message_count", n))...))
}

// endRenew ends a renew span with the Renew's result or error; lost is
// how many of res.Lost the processor gave up (book.applyRenew), the rest
// being leases its own outcome writes settle.
func endRenew(span trace.Span, res leasing.RenewResult, lost int, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	} else {
		span.SetAttributes(attribute.Int(attrRenewed, len(res.Renewed)), attribute.Int(attrLost, lost),
			attribute.Int(attrSettled, len(res.Lost)-lost))
	}
	span.End()
}
