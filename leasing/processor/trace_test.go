package processor_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/leasestore/leasestore/internal/spantest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// traceBundle is a processorBundle whose Memory traces enqueues on tp.
type traceBundle struct {
	*processorBundle
	tp     *spantest.Provider
	claims atomic.Int64 // Claim calls returned
	store  *storeHooks
}

func setupTracing(t *testing.T, q leasing.Queue) *traceBundle {
	t.Helper()
	b := &traceBundle{processorBundle: setupProcessor(t, q), tp: spantest.NewProvider()}
	// Registered before the processor starts, so run after it stopped.
	t.Cleanup(func() { require.NoError(t, b.tp.Check(), "every span started ends exactly once") })
	mem, err := leasing.NewMemory(q, leasing.MemoryOptions{Now: b.clock.Now, TracerProvider: b.tp})
	require.NoError(t, err)
	b.mem = mem
	b.store = &storeHooks{Store: mem}
	b.store.claim = func(ctx context.Context, r leasing.ClaimRequest) ([]leasing.Lease, error) {
		defer b.claims.Add(1)
		return mem.Claim(ctx, r)
	}
	return b
}

// enqueueTraced enqueues one message of type typ under a span of its own
// and returns its id and the send span.
func (b *traceBundle) enqueueTraced(t *testing.T, typ string) (uuid.UUID, spantest.Span) {
	t.Helper()
	ctx, request := b.tp.Tracer("test").Start(context.Background(), "request "+typ)
	defer request.End()
	// Each message is the only one of its ordering key, so keys never
	// hold a message back here; the key is the message id.
	id := uuid.Must(uuid.NewV7())
	m := leasing.NewMessage{ID: id, Type: typ, TenantID: "acme", OrderingKey: id.String()}
	if b.mem.Queue() == leasing.Outbox {
		m.Topic = "orders"
	}
	res, err := b.mem.Enqueue(ctx, m)
	require.NoError(t, err)
	sends := b.tp.Named("send " + string(b.mem.Queue()))
	send := sends[len(sends)-1]
	require.Equal(t, request.SpanContext(), send.Parent)
	return res.IDs[0], send
}

// process returns the ended process spans of id, in end order.
func (b *traceBundle) process(id uuid.UUID) []spantest.Span {
	var out []spantest.Span
	for _, s := range b.tp.Named("process " + string(b.mem.Queue())) {
		if s.Attributes["messaging.message.id"] == attribute.StringValue(id.String()) {
			out = append(out, s)
		}
	}
	return out
}

// spanWithID returns the ended span with span id sid.
func (b *traceBundle) spanWithID(t *testing.T, sid trace.SpanID) spantest.Span {
	t.Helper()
	for _, s := range b.tp.Ended() {
		if s.SpanContext.SpanID() == sid {
			return s
		}
	}
	require.Failf(t, "no such span", "%s", sid)
	return spantest.Span{}
}

// requireProcess checks a process span of send's message: kind, link,
// parent claim and attributes.
func (b *traceBundle) requireProcess(t *testing.T, s spantest.Span, send spantest.Span, attempt int) {
	t.Helper()
	q := b.mem.Queue()
	require.Equal(t, trace.SpanKindConsumer, s.Kind)
	require.Len(t, s.Links, 1)
	require.Equal(t, send.SpanContext.TraceID(), s.Links[0].SpanContext.TraceID())
	require.Equal(t, send.SpanContext.SpanID(), s.Links[0].SpanContext.SpanID(), "linked to the producer, not its child")
	require.NotEqual(t, send.SpanContext.TraceID(), s.SpanContext.TraceID())
	claim := b.spanWithID(t, s.Parent.SpanID())
	require.Equal(t, "claim "+string(q), claim.Name, "the parent is the claim that leased it")
	require.Equal(t, trace.SpanKindClient, claim.Kind)
	require.False(t, claim.Parent.IsValid())
	want := map[attribute.Key]attribute.Value{
		"messaging.system":                      attribute.StringValue("leasestore"),
		"messaging.operation.name":              attribute.StringValue("process"),
		"messaging.operation.type":              attribute.StringValue("process"),
		"messaging.destination.name":            attribute.StringValue(string(q)),
		"messaging.leasestore.attempt":          attribute.IntValue(attempt),
		"messaging.leasestore.lease.generation": attribute.Int64Value(int64(attempt)),
		"messaging.leasestore.tenant_id":        attribute.StringValue("acme"),
		"messaging.leasestore.ordering_key":     s.Attributes["messaging.message.id"],
	}
	for k, v := range want {
		require.Equal(t, v, s.Attributes[k], "%s", k)
	}
	if q == leasing.Outbox {
		require.Equal(t, attribute.StringValue("orders"), s.Attributes["messaging.leasestore.topic"])
	}
}

func TestProcessorTracing(t *testing.T) {
	t.Parallel()
	for _, q := range []leasing.Queue{leasing.Inbox, leasing.Outbox} {
		t.Run(string(q)+"/RetryIsANewSpanLinkedToTheSameProducer", func(t *testing.T) {
			t.Parallel()
			b := setupTracing(t, q)
			id, send := b.enqueueTraced(t, "flaky")
			var calls atomic.Int64
			handlerSpans := make(chan trace.SpanContext, 2)
			r := b.start(t, b.store, func(ctx context.Context, l leasing.Lease) error {
				handlerSpans <- trace.SpanContextFromContext(ctx)
				if calls.Add(1) == 1 {
					return errors.New("broker unavailable")
				}
				return nil
			}, processor.Options{TracerProvider: b.tp})
			waitFor(t, statusIs(b.mem, id, leasing.StatusFailed), "first attempt failed")
			b.clock.Advance(time.Second) // the retry delay
			waitFor(t, statusIs(b.mem, id, q.Succeeded()), "second attempt succeeded")
			require.NoError(t, r.stop(t))

			spans := b.process(id)
			require.Len(t, spans, 2)
			for i, s := range spans {
				b.requireProcess(t, s, send, i+1)
				require.Equal(t, s.SpanContext, <-handlerSpans, "the handler's context carries the process span")
				require.Equal(t, attribute.StringValue(r.p.Owner()), s.Attributes["messaging.client.id"])
			}
			require.NotEqual(t, spans[0].Parent, spans[1].Parent, "each attempt under its own claim")
			require.Equal(t, attribute.StringValue("failed"), spans[0].Attributes["messaging.leasestore.process.result"])
			require.Equal(t, attribute.StringValue("handler_error"), spans[0].Attributes["error.type"])
			require.Equal(t, codes.Error, spans[0].Status)
			require.Equal(t, []string{"exception"}, spans[0].Events)
			require.Equal(t, attribute.StringValue(successResult(q)), spans[1].Attributes["messaging.leasestore.process.result"])
			require.Equal(t, attribute.StringValue("applied"), spans[1].Attributes["messaging.leasestore.write.outcome"])
			require.Equal(t, codes.Unset, spans[1].Status)

			for i, name := range []string{"fail ", "complete "} {
				writes := b.tp.Named(name + string(q))
				require.Len(t, writes, 1)
				w := writes[0]
				require.Equal(t, trace.SpanKindClient, w.Kind)
				require.False(t, w.Parent.IsValid())
				require.Equal(t, attribute.StringValue("settle"), w.Attributes["messaging.operation.type"])
				require.Equal(t, attribute.IntValue(1), w.Attributes["messaging.batch.message_count"])
				require.Equal(t, attribute.IntValue(1), w.Attributes["messaging.leasestore.write.succeeded"])
				require.Len(t, w.Links, 1)
				require.Equal(t, spans[i].SpanContext, w.Links[0].SpanContext, "the write links to the attempt it settles")
			}
		})

		t.Run(string(q)+"/Outcomes", func(t *testing.T) {
			t.Parallel()
			b := setupTracing(t, q)
			sends := map[string]spantest.Span{}
			ids := map[string]uuid.UUID{}
			for _, typ := range []string{"ok", "error", "panic", "timeout"} {
				ids[typ], sends[typ] = b.enqueueTraced(t, typ)
			}
			r := b.start(t, b.store, func(ctx context.Context, l leasing.Lease) error {
				switch l.Message.Type {
				case "error":
					return errors.New("invalid payload")
				case "panic":
					panic("handler bug")
				case "timeout":
					<-ctx.Done()
					return ctx.Err()
				}
				return nil
			}, processor.Options{
				// Every call but the hung one must return before it: at
				// 20 ms a loaded machine could time out the panic's or a
				// quick return's call first.
				TracerProvider: b.tp, HandlerTimeout: 500 * time.Millisecond, RetryPolicy: processor.RetryPolicy{MaxAttempts: 1},
			})
			waitFor(t, statusIs(b.mem, ids["ok"], q.Succeeded()), "ok written")
			for _, typ := range []string{"error", "panic", "timeout"} {
				waitFor(t, statusIs(b.mem, ids[typ], leasing.StatusDeadLettered), typ+" dead-lettered")
			}
			waitFor(t, func() bool { return len(b.process(ids["timeout"])) == 1 }, "the timeout's span ended")
			require.NoError(t, r.stop(t))

			for typ, want := range map[string]string{"error": "handler_error", "panic": "panic", "timeout": "timeout"} {
				spans := b.process(ids[typ])
				require.Len(t, spans, 1, typ)
				s := spans[0]
				b.requireProcess(t, s, sends[typ], 1)
				require.Equal(t, attribute.StringValue("dead_lettered"), s.Attributes["messaging.leasestore.process.result"], typ)
				require.Equal(t, attribute.StringValue(want), s.Attributes["error.type"], typ)
				require.Equal(t, attribute.StringValue("applied"), s.Attributes["messaging.leasestore.write.outcome"], typ)
				require.Equal(t, codes.Error, s.Status, typ)
			}
			require.Equal(t, []string{"handler timed out"}, b.process(ids["timeout"])[0].Events)
			settled := 0
			for _, w := range b.tp.Named("dead_letter " + string(q)) {
				settled += len(w.Links)
			}
			require.Equal(t, 3, settled, "the dead-letter writes link to the three attempts")
		})

		t.Run(string(q)+"/LostLease", func(t *testing.T) {
			t.Parallel()
			b := setupTracing(t, q)
			id, send := b.enqueueTraced(t, "stuck")
			started := make(chan struct{})
			r := b.start(t, b.store, func(ctx context.Context, l leasing.Lease) error {
				close(started)
				<-ctx.Done()
				return context.Cause(ctx)
			}, processor.Options{TracerProvider: b.tp, Concurrency: 1}) // one slot: it claims nothing else
			<-started
			b.clock.Advance(time.Minute) // past the lease: another worker reclaims it
			require.Len(t, b.claimAsOther(t), 1)
			waitFor(t, func() bool { return len(b.process(id)) == 1 }, "the lost attempt's span ended")
			require.NoError(t, r.stop(t))

			s := b.process(id)[0]
			b.requireProcess(t, s, send, 1)
			require.Equal(t, attribute.StringValue("lost"), s.Attributes["messaging.leasestore.process.result"])
			require.Equal(t, attribute.StringValue("lease_lost"), s.Attributes["error.type"])
			require.Equal(t, codes.Error, s.Status)
			_, written := s.Attributes["messaging.leasestore.write.outcome"]
			require.False(t, written, "nothing is written for a lost lease")
			var lost int64
			for _, rs := range b.tp.Named("renew " + string(q)) {
				require.Equal(t, attribute.IntValue(1), rs.Attributes["messaging.batch.message_count"])
				require.Equal(t, attribute.IntValue(0), rs.Attributes["messaging.leasestore.renew.settled"], "no write settled it")
				lost += rs.Attributes["messaging.leasestore.renew.lost"].AsInt64()
			}
			require.Equal(t, int64(1), lost, "the renew that found it lost says so")
		})

		t.Run(string(q)+"/Shutdown", func(t *testing.T) {
			t.Parallel()
			b := setupTracing(t, q)
			id, send := b.enqueueTraced(t, "stuck")
			started := make(chan struct{})
			r := b.start(t, b.store, func(ctx context.Context, l leasing.Lease) error {
				close(started)
				<-ctx.Done()
				return ctx.Err()
			}, processor.Options{TracerProvider: b.tp, ShutdownGrace: 10 * time.Millisecond})
			<-started
			require.NoError(t, r.stop(t))
			spans := b.process(id)
			require.Len(t, spans, 1)
			b.requireProcess(t, spans[0], send, 1)
			require.Equal(t, attribute.StringValue("failed"), spans[0].Attributes["messaging.leasestore.process.result"])
			require.Equal(t, attribute.StringValue("shutdown"), spans[0].Attributes["error.type"])
		})

		t.Run(string(q)+"/NoClaimSpanWhenNothingIsDue", func(t *testing.T) {
			t.Parallel()
			b := setupTracing(t, q)
			id, _ := b.enqueueTraced(t, "ok")
			b.start(t, b.store, func(context.Context, leasing.Lease) error { return nil }, processor.Options{TracerProvider: b.tp})
			waitFor(t, statusIs(b.mem, id, q.Succeeded()), "handled")
			after := b.claims.Load()
			waitFor(t, func() bool { return b.claims.Load() >= after+3 }, "three more claims, empty")
			claims := b.tp.Named("claim " + string(q))
			require.Len(t, claims, 1, "only the claim that took the message is a span")
			require.Equal(t, attribute.IntValue(1), claims[0].Attributes["messaging.batch.message_count"])
			require.Equal(t, attribute.IntValue(processor.DefaultBatchSize), claims[0].Attributes["messaging.leasestore.claim.batch_size"])
		})

		t.Run(string(q)+"/Off", func(t *testing.T) {
			t.Parallel()
			b := setupTracing(t, q)
			id, _ := b.enqueueTraced(t, "ok")
			var handlerSpan trace.SpanContext
			b.start(t, b.store, func(ctx context.Context, l leasing.Lease) error {
				handlerSpan = trace.SpanContextFromContext(ctx)
				return nil
			}, processor.Options{})
			waitFor(t, statusIs(b.mem, id, q.Succeeded()), "handled")
			require.False(t, handlerSpan.IsValid(), "no span without a TracerProvider")
			require.Empty(t, b.process(id))
			require.Empty(t, b.tp.Named("claim "+string(q)))
		})
	}
}

// successResult is the messaging.leasestore.process.result of a success on q:
// the word of its success counter.
func successResult(q leasing.Queue) string {
	return strings.TrimPrefix(processor.SucceededCounter(q), "processor.")
}

// TestTracerName checks that the processor's spans come from the tracer
// its documentation names, so that users can filter by scope.
func TestTracerName(t *testing.T) {
	t.Parallel()
	tp := &scopeRecorder{TracerProvider: noop.NewTracerProvider()}
	b := setupProcessor(t, leasing.Inbox)
	b.enqueue(t, 1)
	r := b.start(t, b.mem, func(context.Context, leasing.Lease) error { return nil }, processor.Options{TracerProvider: tp})
	require.NoError(t, r.stop(t))
	require.Equal(t, []string{processor.TracerName}, tp.names())
	require.Equal(t, "github.com/leasestore/leasestore/leasing/processor", processor.TracerName)
}

// scopeRecorder is a TracerProvider that records the names of the tracers
// asked of it.
type scopeRecorder struct {
	trace.TracerProvider
	mu    sync.Mutex
	asked []string
}

func (s *scopeRecorder) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	s.mu.Lock()
	s.asked = append(s.asked, name)
	s.mu.Unlock()
	return s.TracerProvider.Tracer(name, opts...)
}

func (s *scopeRecorder) names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Compact(slices.Clone(s.asked))
}
