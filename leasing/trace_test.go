package leasing_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/leasestore/leasestore/internal/spantest"
	"github.com/leasestore/leasestore/leasing"
)

// traceHeaders returns the stored headers of the message enqueued as m,
// by store s.
func traceHeaders(t *testing.T, ctx context.Context, s leasing.Store, m leasing.NewMessage) map[string]any {
	t.Helper()
	res, err := s.Enqueue(ctx, m)
	require.NoError(t, err)
	row, err := s.Get(ctx, res.IDs[0])
	require.NoError(t, err)
	var h map[string]any
	require.NoError(t, json.Unmarshal(row.Headers, &h))
	return h
}

func TestEnqueueTraceContext(t *testing.T) {
	t.Parallel()
	caller := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled,
	})
	traceparent := func(sc trace.SpanContext) string {
		return fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags())
	}
	for _, q := range []leasing.Queue{leasing.Inbox, leasing.Outbox} {
		msg := func(headers string) leasing.NewMessage {
			m := leasing.NewMessage{Headers: json.RawMessage(headers)}
			if q == leasing.Outbox {
				m.Topic = "t"
			}
			return m
		}

		t.Run(string(q)+"/SendSpanContextInHeaders", func(t *testing.T) {
			t.Parallel()
			tp := spantest.NewProvider()
			t.Cleanup(func() { require.NoError(t, tp.Check()) })
			mem, err := leasing.NewMemory(q, leasing.MemoryOptions{TracerProvider: tp})
			require.NoError(t, err)
			ctx := trace.ContextWithSpanContext(context.Background(), caller)
			h := traceHeaders(t, ctx, mem, msg(` { "a" : [1, {"b": 2}] } `))
			sends := tp.Named("send " + string(q))
			require.Len(t, sends, 1)
			send := sends[0]
			require.Equal(t, trace.SpanKindProducer, send.Kind)
			require.Equal(t, caller, send.Parent, "a child of the caller's span")
			require.Equal(t, map[string]any{"a": []any{float64(1), map[string]any{"b": float64(2)}}, "traceparent": traceparent(send.SpanContext)}, h,
				"the caller's headers kept, the send span's context added")

			row, err := mem.Get(ctx, mem.Rows()[0].ID)
			require.NoError(t, err)
			got := row.SpanContext()
			require.True(t, got.IsRemote())
			require.Equal(t, send.SpanContext.TraceID(), got.TraceID())
			require.Equal(t, send.SpanContext.SpanID(), got.SpanID())

			// Without a span in the context the send span is a root, and
			// still stored.
			h = traceHeaders(t, context.Background(), mem, msg(""))
			sends = tp.Named("send " + string(q))
			require.Len(t, sends, 2)
			require.False(t, sends[1].Parent.IsValid())
			require.Equal(t, map[string]any{"traceparent": traceparent(sends[1].SpanContext)}, h)
		})

		t.Run(string(q)+"/TraceStateAndOwnTraceparentKept", func(t *testing.T) {
			t.Parallel()
			// The no-op provider's span is the caller's: its context,
			// tracestate included, is what the headers get.
			mem, err := leasing.NewMemory(q, leasing.MemoryOptions{TracerProvider: noop.NewTracerProvider()})
			require.NoError(t, err)
			ts, err := trace.ParseTraceState("vendor=opaque")
			require.NoError(t, err)
			ctx := trace.ContextWithSpanContext(context.Background(), caller.WithTraceState(ts))
			require.Equal(t, map[string]any{"traceparent": traceparent(caller), "tracestate": "vendor=opaque"}, traceHeaders(t, ctx, mem, msg("{}")))

			own := `{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x": "y"}`
			h := traceHeaders(t, ctx, mem, msg(own))
			require.Equal(t, map[string]any{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x": "y"}, h,
				"a caller's own traceparent is not overwritten, and no tracestate is added beside it")
			own = `{"tracestate": "vendor=mine"}`
			require.Equal(t, map[string]any{"tracestate": "vendor=mine"}, traceHeaders(t, ctx, mem, msg(own)), "nor a tracestate")
			for _, bad := range []string{`{"traceparent": null, "x": "y"}`, `{"x": "y", "traceparent": 7, "tracestate": {"a": 1}}`} {
				require.Equal(t, map[string]any{"traceparent": traceparent(caller), "tracestate": "vendor=opaque", "x": "y"}, traceHeaders(t, ctx, mem, msg(bad)),
					"a trace key that holds no string is replaced: %s", bad)
			}
			require.Equal(t, map[string]any{"traceparent": traceparent(caller), "tracestate": "vendor=opaque"}, traceHeaders(t, ctx, mem, msg(`{"traceparent": null}`)))
		})

		t.Run(string(q)+"/SendLinksToCarriedContexts", func(t *testing.T) {
			t.Parallel()
			tp := spantest.NewProvider()
			t.Cleanup(func() { require.NoError(t, tp.Check()) })
			mem, err := leasing.NewMemory(q, leasing.MemoryOptions{TracerProvider: tp})
			require.NoError(t, err)
			carried := func(i int) trace.SpanContext {
				return trace.NewSpanContext(trace.SpanContextConfig{
					TraceID: trace.TraceID{9, byte(i >> 8), byte(i)}, SpanID: trace.SpanID{7, byte(i >> 8), byte(i)}, TraceFlags: trace.FlagsSampled,
				})
			}
			relayed := func(i int) leasing.NewMessage {
				return msg(fmt.Sprintf(`{"traceparent": %q}`, traceparent(carried(i))))
			}
			// Two messages of one context, one of another, one without.
			_, err = mem.Enqueue(context.Background(), relayed(1), relayed(1), msg(""), relayed(2))
			require.NoError(t, err)
			sends := tp.Named("send " + string(q))
			require.Len(t, sends, 1)
			var linked []trace.SpanContext
			for _, l := range sends[0].Links {
				linked = append(linked, l.SpanContext)
			}
			require.Equal(t, []trace.SpanContext{carried(1).WithRemote(true), carried(2).WithRemote(true)}, linked,
				"one link per distinct carried context, in message order")

			// A large relayed batch: links are capped.
			batch := make([]leasing.NewMessage, 2*leasing.MaxSendLinks)
			for i := range batch {
				batch[i] = relayed(i + 10)
			}
			_, err = mem.Enqueue(context.Background(), batch...)
			require.NoError(t, err)
			sends = tp.Named("send " + string(q))
			require.Len(t, sends, 2)
			require.Len(t, sends[1].Links, leasing.MaxSendLinks)
			require.Equal(t, carried(10).WithRemote(true), sends[1].Links[0].SpanContext)
		})

		t.Run(string(q)+"/OffStoresNothing", func(t *testing.T) {
			t.Parallel()
			mem, err := leasing.NewMemory(q, leasing.MemoryOptions{})
			require.NoError(t, err)
			ctx := trace.ContextWithSpanContext(context.Background(), caller)
			require.Equal(t, map[string]any{}, traceHeaders(t, ctx, mem, msg("")))
			require.Equal(t, map[string]any{"a": "b"}, traceHeaders(t, ctx, mem, msg(`{"a":"b"}`)))
		})
	}

	t.Run("SpanContextOfEscapedKey", func(t *testing.T) {
		t.Parallel()
		// Memory keeps the caller's header bytes; PostgreSQL's jsonb
		// decodes the escape (integration: TestTracingEscapedHeaderKey).
		// Both read the same context.
		mem, err := leasing.NewMemory(leasing.Inbox, leasing.MemoryOptions{})
		require.NoError(t, err)
		ctx := context.Background()
		res, err := mem.Enqueue(ctx, leasing.NewMessage{Headers: json.RawMessage(`{"trace\u0070arent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`)})
		require.NoError(t, err)
		row, err := mem.Get(ctx, res.IDs[0])
		require.NoError(t, err)
		sc := row.SpanContext()
		require.True(t, sc.IsValid())
		require.Equal(t, "0af7651916cd43dd8448eb211c80319c", sc.TraceID().String())
		require.Equal(t, "b7ad6b7169203331", sc.SpanID().String())
	})

	t.Run("SpanContextOfBadHeaders", func(t *testing.T) {
		t.Parallel()
		for _, h := range []string{`{}`, `{"traceparent": 1}`, `{"traceparent": null}`, `{"traceparent": ["00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"]}`, `{"traceparent": "00-zz-yy-01"}`, `{"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"}`, `[1]`} {
			require.False(t, leasing.Message{Headers: json.RawMessage(h)}.SpanContext().IsValid(), h)
		}
	})
}
