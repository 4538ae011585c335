package tracing_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// traceBundle is one tracing case: a store of each kind on one tracer
// provider whose spans a recorder keeps.
type traceBundle struct {
	queue    leasing.Queue
	recorder *tracetest.SpanRecorder
	provider *sdktrace.TracerProvider
	store    leasing.Store
	pg       *leasing.Postgres // nil for Memory
}

func traceSetup(t *testing.T, q leasing.Queue, kind string) *traceBundle {
	t.Helper()
	b := &traceBundle{queue: q, recorder: tracetest.NewSpanRecorder()}
	b.provider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(b.recorder))
	t.Cleanup(func() { require.NoError(t, b.provider.Shutdown(context.Background())) })
	var err error
	if kind == "Postgres" {
		b.pg, err = leasing.NewPostgres(dbtest.NewPool(t), q, leasing.PostgresOptions{TracerProvider: b.provider})
		b.store = b.pg
	} else {
		b.store, err = leasing.NewMemory(q, leasing.MemoryOptions{TracerProvider: b.provider})
	}
	require.NoError(t, err)
	return b
}

// message returns a NewMessage of type typ for the case's queue.
func (b *traceBundle) message(typ, headers string) leasing.NewMessage {
	m := leasing.NewMessage{Type: typ, Payload: []byte(`{}`), Headers: json.RawMessage(headers), TenantID: "acme"}
	if b.queue == leasing.Outbox {
		m.Topic = "orders"
	}
	return m
}

// spans returns the ended spans named name, in end order.
func (b *traceBundle) spans(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range b.recorder.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// processSpans returns the ended process spans of message id, by attempt.
func (b *traceBundle) processSpans(id uuid.UUID) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range b.spans("process " + string(b.queue)) {
		if traceAttrs(s)["messaging.message.id"] == attribute.StringValue(id.String()) {
			out = append(out, s)
		}
	}
	return out
}

func traceAttrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// headers returns the stored headers of id as a map.
func (b *traceBundle) headers(t *testing.T, id uuid.UUID) map[string]any {
	t.Helper()
	row, err := b.store.Get(context.Background(), id)
	require.NoError(t, err)
	var h map[string]any
	require.NoError(t, json.Unmarshal(row.Headers, &h))
	return h
}

// traceparent is the W3C traceparent of sc.
func traceparent(sc trace.SpanContext) string {
	return fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags())
}

// requireLinkedTo checks that s has exactly one link, to sc.
func requireLinkedTo(t *testing.T, s sdktrace.ReadOnlySpan, sc trace.SpanContext) {
	t.Helper()
	require.Len(t, s.Links(), 1, s.Name())
	got := s.Links()[0].SpanContext
	require.Equal(t, sc.TraceID(), got.TraceID(), s.Name())
	require.Equal(t, sc.SpanID(), got.SpanID(), s.Name())
	require.True(t, got.IsRemote(), "the link is read from the headers")
}

// TestTracing follows messages of both queues on both stores from the
// span that enqueued them through each attempt's process span to the
// outcome write, with the SDK's span recorder.
func TestTracing(t *testing.T) {
	t.Parallel()
	for _, q := range []leasing.Queue{leasing.Inbox, leasing.Outbox} {
		for _, kind := range []string{"Postgres", "Memory"} {
			t.Run(string(q)+"/"+kind, func(t *testing.T) {
				t.Parallel()
				testTracing(t, traceSetup(t, q, kind))
			})
		}
	}
}

func testTracing(t *testing.T, b *traceBundle) {
	q := b.queue
	ctx, request := b.provider.Tracer("test").Start(context.Background(), "request")
	res, err := b.store.Enqueue(ctx, b.message("flaky", `{"a": 1}`))
	require.NoError(t, err)
	flaky := res.IDs[0]
	// A caller's own traceparent (a relay forwarding its producer's) is kept.
	own := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{0x4b, 0xf9, 1}, SpanID: trace.SpanID{0x00, 0xf0, 2}, TraceFlags: trace.FlagsSampled,
	})
	res, err = b.store.Enqueue(ctx, b.message("panics", `{"traceparent": "`+traceparent(own)+`"}`), b.message("ok", ""))
	require.NoError(t, err)
	panics, ok := res.IDs[0], res.IDs[1]
	request.End()

	sends := b.spans("send " + string(q))
	require.Len(t, sends, 2)
	one, batch := sends[0], sends[1]
	for _, s := range sends {
		require.Equal(t, trace.SpanKindProducer, s.SpanKind())
		require.Equal(t, request.SpanContext().SpanID(), s.Parent().SpanID(), "a child of the caller's span")
		a := traceAttrs(s)
		require.Equal(t, "leasestore", a["messaging.system"].AsString())
		require.Equal(t, "send", a["messaging.operation.type"].AsString())
		require.Equal(t, string(q), a["messaging.destination.name"].AsString())
	}
	require.Equal(t, flaky.String(), traceAttrs(one)["messaging.message.id"].AsString())
	require.Equal(t, int64(2), traceAttrs(batch)["messaging.batch.message_count"].AsInt64())

	// The headers hold the send span's context, the caller's keys kept.
	require.Equal(t, map[string]any{"a": float64(1), "traceparent": traceparent(one.SpanContext())}, b.headers(t, flaky))
	require.Equal(t, map[string]any{"traceparent": traceparent(own)}, b.headers(t, panics))
	require.Equal(t, map[string]any{"traceparent": traceparent(batch.SpanContext())}, b.headers(t, ok))

	var mu sync.Mutex
	calls := map[uuid.UUID]int{}
	handle := func(ctx context.Context, m leasing.Message) error {
		_, child := b.provider.Tracer("test").Start(ctx, "handle")
		defer child.End()
		mu.Lock()
		calls[m.ID]++
		n := calls[m.ID]
		mu.Unlock()
		switch {
		case m.Type == "flaky" && n == 1:
			// Hold the lease until the heartbeat renewed it once.
			for deadline := time.Now().Add(e2eWait); len(b.spans("renew "+string(q))) == 0 && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			return errors.New("broker unavailable")
		case m.Type == "panics" && n == 1:
			panic("handler bug")
		}
		return nil
	}
	var handler processor.Handler = func(ctx context.Context, l leasing.Lease) error { return handle(ctx, l.Message) }
	if q == leasing.Outbox {
		handler = processor.Publisher(handle).Handler()
	}
	p, err := processor.New(b.store, handler, processor.Options{
		Owner: "traced", TracerProvider: b.provider, PollInterval: 5 * time.Millisecond, HeartbeatInterval: 5 * time.Millisecond,
		RetryPolicy: processor.RetryPolicy{InitialDelay: time.Millisecond, MaxAttempts: 3},
	})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- p.Run(runCtx) }()
	for _, id := range []uuid.UUID{flaky, panics, ok} {
		require.Eventually(t, func() bool { return len(b.processSpans(id)) == 2 || (id == ok && len(b.processSpans(id)) == 1) },
			e2eWait, time.Millisecond, "process spans of %s", id)
	}
	stop()
	require.NoError(t, <-ran)

	// Each attempt is a process span of its own, linked to the send span,
	// a child of the claim span that leased it; the handler's span is its
	// child.
	producers := map[uuid.UUID]trace.SpanContext{flaky: one.SpanContext(), panics: own, ok: batch.SpanContext()}
	claims := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range b.spans("claim " + string(q)) {
		claims[s.SpanContext().SpanID()] = s
		require.Equal(t, trace.SpanKindClient, s.SpanKind())
		require.False(t, s.Parent().IsValid(), "a claim is a root span")
		a := traceAttrs(s)
		require.Equal(t, "receive", a["messaging.operation.type"].AsString())
		require.Equal(t, p.Owner(), a["messaging.client.id"].AsString())
		require.Equal(t, int64(processor.DefaultBatchSize), a["messaging.leasestore.claim.batch_size"].AsInt64())
		require.Len(t, s.Links(), int(a["messaging.batch.message_count"].AsInt64()), "a link per lease")
		require.Positive(t, a["messaging.batch.message_count"].AsInt64(), "no span for a claim that found nothing")
	}
	handlers := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	for _, s := range b.spans("handle") {
		handlers[s.Parent().SpanID()] = s
	}
	for id, producer := range producers {
		spans := b.processSpans(id)
		var firstGeneration int64 // the first attempt's
		if len(spans) > 0 {
			firstGeneration = traceAttrs(spans[0])["messaging.leasestore.lease.generation"].AsInt64()
		}
		for i, s := range spans {
			require.Equal(t, trace.SpanKindConsumer, s.SpanKind())
			requireLinkedTo(t, s, producer)
			claim, found := claims[s.Parent().SpanID()]
			require.True(t, found, "the parent of a process span is its claim")
			require.Equal(t, claim.SpanContext().TraceID(), s.SpanContext().TraceID())
			_, found = handlers[s.SpanContext().SpanID()]
			require.True(t, found, "the handler's context carries the process span")
			a := traceAttrs(s)
			require.Equal(t, int64(i+1), a["messaging.leasestore.attempt"].AsInt64())
			require.Equal(t, firstGeneration+int64(i), a["messaging.leasestore.lease.generation"].AsInt64(), "one generation a claim")
			require.Equal(t, "acme", a["messaging.leasestore.tenant_id"].AsString())
			require.Equal(t, "process", a["messaging.operation.type"].AsString())
			require.Equal(t, p.Owner(), a["messaging.client.id"].AsString())
			if q == leasing.Outbox {
				require.Equal(t, "orders", a["messaging.leasestore.topic"].AsString())
			}
			if i == len(spans)-1 {
				require.Equal(t, successResult(q), a["messaging.leasestore.process.result"].AsString(), "attempt %d of %s", i+1, id)
				require.Equal(t, "applied", a["messaging.leasestore.write.outcome"].AsString())
				require.Equal(t, codes.Unset, s.Status().Code)
				continue
			}
			require.Equal(t, "failed", a["messaging.leasestore.process.result"].AsString(), "attempt %d of %s", i+1, id)
			require.Equal(t, codes.Error, s.Status().Code)
			want := map[uuid.UUID]string{flaky: "handler_error", panics: "panic"}[id]
			require.Equal(t, want, a["error.type"].AsString())
			require.NotEmpty(t, s.Events(), "the error is recorded")
		}
	}

	// The outcome writes are spans of their own, linked to the process
	// spans they settle.
	processes := map[trace.SpanID]bool{}
	for _, s := range b.spans("process " + string(q)) {
		processes[s.SpanContext().SpanID()] = true
	}
	writes := append(b.spans("complete "+string(q)), b.spans("fail "+string(q))...)
	linked := 0
	for _, s := range writes {
		require.Equal(t, "settle", traceAttrs(s)["messaging.operation.type"].AsString())
		for _, l := range s.Links() {
			require.True(t, processes[l.SpanContext.SpanID()])
			linked++
		}
	}
	require.Equal(t, len(processes), linked, "every attempt's write links to its process span")
	require.NotEmpty(t, b.spans("fail "+string(q)))
	renews := b.spans("renew " + string(q))
	require.NotEmpty(t, renews)
	for _, s := range renews {
		if s.Status().Code == codes.Error { // cut off by the shutdown
			require.NotEmpty(t, s.Events(), "the error is recorded")
			continue
		}
		a := traceAttrs(s)
		require.Equal(t, a["messaging.batch.message_count"].AsInt64(),
			a["messaging.leasestore.renew.renewed"].AsInt64()+a["messaging.leasestore.renew.lost"].AsInt64()+a["messaging.leasestore.renew.settled"].AsInt64())
	}
}

// TestTracingEnqueueInCallerTransaction checks EnqueueTx and EnqueueCopy
// store the trace context too, on both queues.
func TestTracingEnqueueInCallerTransaction(t *testing.T) {
	t.Parallel()
	for _, q := range []leasing.Queue{leasing.Inbox, leasing.Outbox} {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			b := traceSetup(t, q, "Postgres")
			ctx, request := b.provider.Tracer("test").Start(context.Background(), "request")
			defer request.End()
			var ids []uuid.UUID
			require.NoError(t, pgx.BeginFunc(ctx, b.pg.Pool(), func(tx pgx.Tx) error {
				res, err := b.pg.EnqueueTx(ctx, tx, b.message("tx", ""))
				if err != nil {
					return err
				}
				copied, err := b.pg.EnqueueCopy(ctx, tx, b.message("copy", `{"k":"v"}`))
				ids = append(res.IDs, copied...)
				return err
			}))
			sends := b.spans("send " + string(q))
			require.Len(t, sends, 2)
			require.Equal(t, traceparent(sends[0].SpanContext()), b.headers(t, ids[0])["traceparent"])
			require.Equal(t, map[string]any{"k": "v", "traceparent": traceparent(sends[1].SpanContext())}, b.headers(t, ids[1]))
		})
	}
}

// TestTracingEscapedHeaderKey checks that both stores read a caller's
// traceparent whose key is written with an escape: PostgreSQL's jsonb
// stores it decoded, Memory keeps the bytes as given. The send span links
// to that carried context.
func TestTracingEscapedHeaderKey(t *testing.T) {
	t.Parallel()
	const own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	for _, kind := range []string{"Postgres", "Memory"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			b := traceSetup(t, leasing.Inbox, kind)
			ctx := context.Background()
			res, err := b.store.Enqueue(ctx, b.message("relayed", `{"trace\u0070arent": "`+own+`"}`))
			require.NoError(t, err)
			require.Equal(t, map[string]any{"traceparent": own}, b.headers(t, res.IDs[0]), "the caller's context is kept")
			row, err := b.store.Get(ctx, res.IDs[0])
			require.NoError(t, err)
			sc := row.SpanContext()
			require.True(t, sc.IsValid(), kind)
			require.Equal(t, own, traceparent(sc))
			sends := b.spans("send " + string(leasing.Inbox))
			require.Len(t, sends, 1)
			requireLinkedTo(t, sends[0], sc)
		})
	}
}

// TestTracingOff checks that stores without a TracerProvider store no
// trace context, also when the caller's context carries a span.
func TestTracingOff(t *testing.T) {
	t.Parallel()
	for _, q := range []leasing.Queue{leasing.Inbox, leasing.Outbox} {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			b := traceSetup(t, q, "Postgres")
			ctx, request := b.provider.Tracer("test").Start(context.Background(), "request")
			defer request.End()
			pg, err := leasing.NewPostgres(b.pg.Pool(), q, leasing.PostgresOptions{})
			require.NoError(t, err)
			mem, err := leasing.NewMemory(q, leasing.MemoryOptions{})
			require.NoError(t, err)
			for _, s := range []leasing.Store{pg, mem} {
				res, err := s.Enqueue(ctx, b.message("off", ""))
				require.NoError(t, err)
				row, err := s.Get(ctx, res.IDs[0])
				require.NoError(t, err)
				require.JSONEq(t, `{}`, string(row.Headers))
				require.False(t, row.SpanContext().IsValid())
			}
			var ids []uuid.UUID
			require.NoError(t, pgx.BeginFunc(ctx, pg.Pool(), func(tx pgx.Tx) error {
				ids, err = pg.EnqueueCopy(ctx, tx, b.message("copy", ""))
				return err
			}))
			require.NotContains(t, strings.Join(mapKeys(b.headers(t, ids[0])), ","), "traceparent")
			require.Empty(t, b.recorder.Ended(), "the caller's span is still open; the stores started none")
		})
	}
}

func mapKeys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestTracingBatch follows the messages of one batch handler call on
// Postgres, both queues: each lease has its process span, linked to its
// enqueue span and a child of the claim; the call's span, which the
// handler's context carries, is their sibling, linked to each.
func TestTracingBatch(t *testing.T) {
	t.Parallel()
	for _, q := range []leasing.Queue{leasing.Inbox, leasing.Outbox} {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			b := traceSetup(t, q, "Postgres")
			ctx, request := b.provider.Tracer("test").Start(context.Background(), "request")
			res, err := b.store.Enqueue(ctx, b.message("ok", ""), b.message("rejected", ""), b.message("ok", ""))
			require.NoError(t, err)
			request.End()
			ids := res.IDs
			sends := b.spans("send " + string(q))
			require.Len(t, sends, 1)

			handlerSpan := make(chan trace.SpanContext, 1)
			p, err := processor.NewBatch(b.store, func(ctx context.Context, leases []leasing.Lease) []error {
				handlerSpan <- trace.SpanContextFromContext(ctx)
				errs := make([]error, len(leases))
				for i, l := range leases {
					if l.Message.Type == "rejected" {
						errs[i] = errors.New("broker: rejected")
					}
				}
				return errs
			}, processor.Options{Owner: "traced", TracerProvider: b.provider, PollInterval: 5 * time.Millisecond})
			require.NoError(t, err)
			runCtx, stop := context.WithCancel(context.Background())
			ran := make(chan error, 1)
			go func() { ran <- p.Run(runCtx) }()
			for _, id := range ids {
				require.Eventually(t, func() bool { return len(b.processSpans(id)) == 1 }, e2eWait, time.Millisecond, "process span of %s", id)
			}
			stop()
			require.NoError(t, <-ran)

			claims := b.spans("claim " + string(q))
			require.Len(t, claims, 1, "one claim leased all three")
			claim := claims[0].SpanContext()
			var batch sdktrace.ReadOnlySpan
			for _, s := range b.spans("process " + string(q)) {
				if _, one := traceAttrs(s)["messaging.message.id"]; !one {
					require.Nil(t, batch, "one span per call")
					batch = s
				}
			}
			require.NotNil(t, batch)
			require.Equal(t, batch.SpanContext(), <-handlerSpan, "the handler's context carries the call's span")
			require.Equal(t, trace.SpanKindInternal, batch.SpanKind())
			require.Equal(t, claim.SpanID(), batch.Parent().SpanID())
			a := traceAttrs(batch)
			require.Equal(t, int64(3), a["messaging.batch.message_count"].AsInt64())
			require.Equal(t, int64(1), a["messaging.leasestore.batch.failed"].AsInt64())
			require.Equal(t, codes.Unset, batch.Status().Code)
			require.Len(t, batch.Links(), 3)
			links := map[trace.SpanID]sdktrace.Link{}
			for _, l := range batch.Links() {
				links[l.SpanContext.SpanID()] = l
			}
			for i, id := range ids {
				s := b.processSpans(id)[0]
				require.Equal(t, trace.SpanKindConsumer, s.SpanKind())
				requireLinkedTo(t, s, sends[0].SpanContext())
				require.Equal(t, claim.SpanID(), s.Parent().SpanID(), "a child of the claim")
				l, linked := links[s.SpanContext().SpanID()]
				require.True(t, linked, "the call links to each lease's span")
				require.Equal(t, []attribute.KeyValue{attribute.String("messaging.message.id", id.String())}, l.Attributes)
				a := traceAttrs(s)
				require.Equal(t, p.Owner(), a["messaging.client.id"].AsString())
				require.Equal(t, int64(1), a["messaging.leasestore.attempt"].AsInt64())
				require.Equal(t, "applied", a["messaging.leasestore.write.outcome"].AsString())
				if i == 1 {
					require.Equal(t, "failed", a["messaging.leasestore.process.result"].AsString())
					require.Equal(t, "handler_error", a["error.type"].AsString())
					require.Equal(t, codes.Error, s.Status().Code)
					continue
				}
				require.Equal(t, successResult(q), a["messaging.leasestore.process.result"].AsString())
				require.Equal(t, codes.Unset, s.Status().Code)
			}
			completes := b.spans("complete " + string(q))
			require.Len(t, completes, 1, "the call's successes are written by one store call")
			require.Len(t, completes[0].Links(), 2)
		})
	}
}

// successResult is the messaging.leasestore.process.result of a success on q:
// the word of its success counter.
func successResult(q leasing.Queue) string {
	return strings.TrimPrefix(processor.SucceededCounter(q), "processor.")
}
