package leasing

import (
	"bytes"
	"context"
	"encoding/json"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// The message headers that carry the enqueue span's W3C trace context
// (https://www.w3.org/TR/trace-context/): a store with a TracerProvider
// writes them, Message.SpanContext reads them. tracestate only when set.
const (
	HeaderTraceParent = "traceparent"
	HeaderTraceState  = "tracestate"
)

// TracerName is the instrumentation scope of the stores' spans.
const TracerName = "github.com/leasestore/leasestore/leasing"

// MessagingSystem is the messaging.system attribute of every span the
// stores and the processor start.
const MessagingSystem = "leasestore"

// traceContext is the propagator of the trace headers.
var traceContext = propagation.TraceContext{}

// SpanContext returns the remote trace context the message was enqueued
// under (HeaderTraceParent), invalid when its headers hold none. Keys are
// matched after JSON decoding, so escaped spellings are found too. The
// processor links each attempt's span to it.
func (m Message) SpanContext() trace.SpanContext {
	return headerSpanContext(traceCarrier(m.Headers))
}

// traceKeys are the trace headers, in the order they are written.
var traceKeys = [...]string{HeaderTraceParent, HeaderTraceState}

// traceCarrier returns the trace headers of headers, a JSON object, that
// hold a string; none when headers is not an object.
func traceCarrier(headers json.RawMessage) propagation.MapCarrier {
	var h map[string]json.RawMessage
	if json.Unmarshal(headers, &h) != nil {
		return nil
	}
	carrier := propagation.MapCarrier{}
	for _, k := range traceKeys {
		var s string
		if v := bytes.TrimSpace(h[k]); len(v) > 0 && v[0] == '"' && json.Unmarshal(v, &s) == nil {
			carrier[k] = s
		}
	}
	return carrier
}

// headerSpanContext returns the remote span context carrier names, invalid
// when it names none.
func headerSpanContext(carrier propagation.MapCarrier) trace.SpanContext {
	if carrier[HeaderTraceParent] == "" {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(traceContext.Extract(context.Background(), carrier))
}

// tracing starts a store's send spans; the zero value, a store without a
// TracerProvider, starts none and writes no trace headers.
type tracing struct {
	tracer trace.Tracer
}

func newTracing(tp trace.TracerProvider) tracing {
	if tp == nil {
		return tracing{}
	}
	return tracing{tracer: tp.Tracer(TracerName)}
}

// send starts the send span of an enqueue of msgs (validated) on queue q
// and returns msgs with its trace context in their headers. A message that
// carries a trace context already (a relay's) keeps it, and the span links
// to it (carriedLinks). Without tracing it returns a no-op span and msgs.
func (t tracing) send(ctx context.Context, q Queue, msgs []NewMessage) (context.Context, trace.Span, []NewMessage) {
	if t.tracer == nil {
		return ctx, trace.SpanFromContext(context.Background()), msgs // a no-op span
	}
	attrs := []attribute.KeyValue{
		attribute.String("messaging.system", MessagingSystem),
		attribute.String("messaging.operation.name", "send"),
		attribute.String("messaging.operation.type", "send"),
		attribute.String("messaging.destination.name", string(q)),
	}
	if len(msgs) == 1 {
		attrs = append(attrs, attribute.String("messaging.message.id", msgs[0].ID.String()))
	} else {
		attrs = append(attrs, attribute.Int("messaging.batch.message_count", len(msgs)))
	}
	links := carriedLinks(msgs)
	ctx, span := t.tracer.Start(ctx, "send "+string(q), trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attrs...), trace.WithLinks(links...))
	carrier := propagation.MapCarrier{}
	traceContext.Inject(ctx, carrier)
	if carrier[HeaderTraceParent] == "" {
		return ctx, span, msgs
	}
	for i := range msgs {
		msgs[i].Headers = withTraceHeaders(msgs[i].Headers, carrier)
	}
	return ctx, span, msgs
}

// MaxSendLinks is the most links a send span gets to the distinct trace
// contexts its messages carry already, in message order: the OpenTelemetry
// SDK's default link limit. Contexts past it stay in the headers, unlinked.
const MaxSendLinks = 128

// carriedLinks returns the links of a send span of msgs to the valid trace
// contexts their headers hold already, one per distinct context, at most
// MaxSendLinks.
func carriedLinks(msgs []NewMessage) []trace.Link {
	var (
		links []trace.Link
		seen  map[[24]byte]bool
	)
	for _, m := range msgs {
		if len(links) == MaxSendLinks {
			break
		}
		sc := headerSpanContext(traceCarrier(m.Headers))
		if !sc.IsValid() {
			continue
		}
		var key [24]byte
		tid, sid := sc.TraceID(), sc.SpanID()
		copy(key[:16], tid[:])
		copy(key[16:], sid[:])
		if seen[key] {
			continue
		}
		if seen == nil {
			seen = map[[24]byte]bool{}
		}
		seen[key] = true
		links = append(links, trace.Link{SpanContext: sc})
	}
	return links
}

// withTraceHeaders returns headers, a JSON object, with the carrier's keys
// appended to the caller's bytes, or unchanged when it holds either as a
// string already. A trace key holding another value (null, a number) is
// replaced, and the object rewritten with sorted keys.
func withTraceHeaders(headers json.RawMessage, carrier propagation.MapCarrier) json.RawMessage {
	headers = bytes.TrimSpace(headers)
	empty := bytes.Equal(headers, []byte("{}"))
	if !empty {
		var h map[string]json.RawMessage
		if json.Unmarshal(headers, &h) != nil {
			return headers // validated as an object: not reached
		}
		if len(traceCarrier(headers)) > 0 {
			return headers
		}
		replace := false
		for _, k := range traceKeys {
			if _, ok := h[k]; ok {
				delete(h, k)
				replace = true
			}
		}
		if replace {
			headers, _ = json.Marshal(h) // raw JSON values: cannot fail
		}
		empty = len(h) == 0
	}
	out := make([]byte, 0, len(headers)+100)
	out = append(out, headers[:len(headers)-1]...) // without the closing brace
	for _, k := range traceKeys {
		v := carrier[k]
		if v == "" {
			continue
		}
		if !empty {
			out = append(out, ',')
		}
		empty = false
		key, _ := json.Marshal(k)
		val, _ := json.Marshal(v) // a string: cannot fail
		out = append(append(append(out, key...), ':'), val...)
	}
	return append(out, '}')
}

// endSend ends the send span of an enqueue that returned err.
func endSend(span trace.Span, duplicates int, err error) {
	if !span.IsRecording() {
		span.End()
		return
	}
	if duplicates > 0 {
		span.SetAttributes(attribute.Int("messaging.leasestore.duplicates", duplicates))
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
