package processor_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/leasestore/leasestore/internal/spantest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// batchSpans returns the ended process spans of batch calls (those without
// a message id), in end order.
func (b *traceBundle) batchSpans() []spantest.Span {
	var out []spantest.Span
	for _, s := range b.tp.Named("process " + string(b.mem.Queue())) {
		if _, one := s.Attributes["messaging.message.id"]; !one {
			out = append(out, s)
		}
	}
	return out
}

// enqueueBatch enqueues one traced message of each type and returns their
// ids and send spans, in order.
func (b *traceBundle) enqueueBatch(t *testing.T, types ...string) ([]uuid.UUID, []spantest.Span) {
	t.Helper()
	ids := make([]uuid.UUID, len(types))
	sends := make([]spantest.Span, len(types))
	for i, typ := range types {
		ids[i], sends[i] = b.enqueueTraced(t, typ)
	}
	return ids, sends
}

// requireBatch checks the one batch span against the process spans of ids
// (attempt 1, sends their enqueue spans): every lease has its own process
// span, a child of the claim and linked to its producer; the batch span is
// their sibling, linked to each; the handler's context carried it.
func (b *traceBundle) requireBatch(t *testing.T, ids []uuid.UUID, sends []spantest.Span, handlerSpan trace.SpanContext) (batch spantest.Span, processes []spantest.Span) {
	t.Helper()
	batches := b.batchSpans()
	require.Len(t, batches, 1)
	batch = batches[0]
	require.Equal(t, batch.SpanContext, handlerSpan, "the handler's context carries the batch span")
	require.Equal(t, trace.SpanKindInternal, batch.Kind)
	require.Equal(t, "claim "+string(b.mem.Queue()), b.spanWithID(t, batch.Parent.SpanID()).Name, "a child of the claim")
	require.Equal(t, attribute.IntValue(len(ids)), batch.Attributes["messaging.batch.message_count"])
	require.Equal(t, attribute.StringValue("process"), batch.Attributes["messaging.operation.type"])
	require.Len(t, batch.Links, len(ids))
	links := map[trace.SpanID]trace.Link{}
	for _, l := range batch.Links {
		links[l.SpanContext.SpanID()] = l
	}
	for i, id := range ids {
		spans := b.process(id)
		require.Len(t, spans, 1, "one process span per lease")
		s := spans[0]
		b.requireProcess(t, s, sends[i], 1)
		require.Equal(t, batch.Parent, s.Parent, "the lease's claim is the batch's")
		_, counted := s.Attributes["messaging.batch.message_count"]
		require.False(t, counted, "a process span of one message has no batch count")
		l, linked := links[s.SpanContext.SpanID()]
		require.True(t, linked, "the batch links to each lease's process span")
		require.Equal(t, []attribute.KeyValue{attribute.String("messaging.message.id", id.String())}, l.Attributes)
		processes = append(processes, s)
	}
	return batch, processes
}

// loseBatch runs one batch call over two traced messages with opts
// (Concurrency 1) while another worker reclaims both leases; once the
// call's context has ended, the handler returns after(ctx, leases). It
// returns the call's span and the leases' process spans, checked by
// requireBatch, once all have ended.
func (b *traceBundle) loseBatch(t *testing.T, opts processor.Options, after processor.BatchHandler) (batch spantest.Span, processes []spantest.Span) {
	t.Helper()
	ids, sends := b.enqueueBatch(t, "a", "b")
	started := make(chan trace.SpanContext, 1)
	opts.TracerProvider, opts.Concurrency = b.tp, 1
	b.startBatch(t, b.store, func(ctx context.Context, leases []leasing.Lease) []error {
		started <- trace.SpanContextFromContext(ctx)
		<-ctx.Done() // every lease lost
		return after(ctx, leases)
	}, opts)
	handlerSpan := receive(t, started, "the call started")
	b.clock.Advance(time.Minute) // past the leases: another worker reclaims both
	require.Len(t, b.claimAsOther(t), 2)
	waitFor(t, func() bool { return len(b.batchSpans()) == 1 }, "the call returned")
	for _, id := range ids {
		waitFor(t, func() bool { return len(b.process(id)) == 1 }, "process span ended")
	}
	return b.requireBatch(t, ids, sends, handlerSpan)
}

func TestBatchProcessorTracing(t *testing.T) {
	t.Parallel()
	for _, q := range []leasing.Queue{leasing.Inbox, leasing.Outbox} {
		t.Run(string(q)+"/ProcessSpanPerLease", func(t *testing.T) {
			t.Parallel()
			b := setupTracing(t, q)
			ids, sends := b.enqueueBatch(t, "ok", "error", "ok")
			handlerSpan := make(chan trace.SpanContext, 1)
			b.startBatch(t, b.store, func(ctx context.Context, leases []leasing.Lease) []error {
				handlerSpan <- trace.SpanContextFromContext(ctx)
				errs := make([]error, len(leases))
				for i, l := range leases {
					if l.Message.Type == "error" {
						errs[i] = errors.New("broker rejected it")
					}
				}
				return errs
			}, processor.Options{TracerProvider: b.tp})
			waitFor(t, func() bool { return len(b.process(ids[0]))+len(b.process(ids[1]))+len(b.process(ids[2])) == 3 }, "three process spans ended")

			batch, spans := b.requireBatch(t, ids, sends, <-handlerSpan)
			require.Equal(t, attribute.IntValue(1), batch.Attributes["messaging.leasestore.batch.failed"])
			require.Equal(t, codes.Unset, batch.Status, "one message's error is not the call's")
			for _, i := range []int{0, 2} {
				require.Equal(t, attribute.StringValue(successResult(q)), spans[i].Attributes["messaging.leasestore.process.result"])
				require.Equal(t, attribute.StringValue("applied"), spans[i].Attributes["messaging.leasestore.write.outcome"])
				require.Equal(t, codes.Unset, spans[i].Status)
			}
			require.Equal(t, attribute.StringValue("failed"), spans[1].Attributes["messaging.leasestore.process.result"])
			require.Equal(t, attribute.StringValue("handler_error"), spans[1].Attributes["error.type"])
			require.Equal(t, codes.Error, spans[1].Status)
			require.Equal(t, []string{"exception"}, spans[1].Events)
			completes := b.tp.Named("complete " + string(q))
			require.Len(t, completes, 1, "the call's successes are written together")
			require.Len(t, completes[0].Links, 2)
		})

		t.Run(string(q)+"/PanicFailsEveryLease", func(t *testing.T) {
			t.Parallel()
			b := setupTracing(t, q)
			ids, sends := b.enqueueBatch(t, "a", "b")
			handlerSpan := make(chan trace.SpanContext, 1)
			b.startBatch(t, b.store, func(ctx context.Context, leases []leasing.Lease) []error {
				handlerSpan <- trace.SpanContextFromContext(ctx)
				panic("relay bug")
			}, processor.Options{TracerProvider: b.tp, RetryPolicy: processor.RetryPolicy{MaxAttempts: 1}})
			for _, id := range ids {
				waitFor(t, func() bool { return len(b.process(id)) == 1 }, "process span ended")
			}
			batch, spans := b.requireBatch(t, ids, sends, <-handlerSpan)
			require.Equal(t, attribute.StringValue("panic"), batch.Attributes["error.type"])
			require.Equal(t, codes.Error, batch.Status)
			require.Equal(t, []string{"exception"}, batch.Events)
			for _, s := range spans {
				require.Equal(t, attribute.StringValue("dead_lettered"), s.Attributes["messaging.leasestore.process.result"])
				require.Equal(t, attribute.StringValue("panic"), s.Attributes["error.type"])
				require.Equal(t, codes.Error, s.Status)
			}
		})

		t.Run(string(q)+"/WrongLength", func(t *testing.T) {
			t.Parallel()
			b := setupTracing(t, q)
			ids, sends := b.enqueueBatch(t, "a", "b")
			handlerSpan := make(chan trace.SpanContext, 1)
			b.startBatch(t, b.store, func(ctx context.Context, leases []leasing.Lease) []error {
				handlerSpan <- trace.SpanContextFromContext(ctx)
				return nil
			}, processor.Options{TracerProvider: b.tp, RetryPolicy: processor.RetryPolicy{MaxAttempts: 1}})
			for _, id := range ids {
				waitFor(t, func() bool { return len(b.process(id)) == 1 }, "process span ended")
			}
			batch, spans := b.requireBatch(t, ids, sends, <-handlerSpan)
			require.Equal(t, attribute.StringValue("batch_length"), batch.Attributes["error.type"])
			require.Equal(t, codes.Error, batch.Status)
			for _, s := range spans {
				require.Equal(t, attribute.StringValue("batch_length"), s.Attributes["error.type"])
			}
		})

		t.Run(string(q)+"/Timeout", func(t *testing.T) {
			t.Parallel()
			b := setupTracing(t, q)
			ids, sends := b.enqueueBatch(t, "a", "b")
			handlerSpan := make(chan trace.SpanContext, 1)
			b.startBatch(t, b.store, func(ctx context.Context, leases []leasing.Lease) []error {
				handlerSpan <- trace.SpanContextFromContext(ctx)
				<-ctx.Done()
				return repeat(len(leases), ctx.Err())
			}, processor.Options{TracerProvider: b.tp, HandlerTimeout: 20 * time.Millisecond, RetryPolicy: processor.RetryPolicy{MaxAttempts: 1}})
			waitFor(t, func() bool { return len(b.batchSpans()) == 1 }, "the call returned")
			for _, id := range ids {
				waitFor(t, func() bool { return len(b.process(id)) == 1 }, "process span ended")
			}
			batch, spans := b.requireBatch(t, ids, sends, <-handlerSpan)
			require.Equal(t, attribute.StringValue("timeout"), batch.Attributes["error.type"])
			require.Equal(t, []string{"handler timed out"}, batch.Events)
			require.Equal(t, codes.Error, batch.Status)
			for _, s := range spans {
				require.Equal(t, attribute.StringValue("dead_lettered"), s.Attributes["messaging.leasestore.process.result"])
				require.Equal(t, attribute.StringValue("timeout"), s.Attributes["error.type"])
				require.Equal(t, []string{"handler timed out"}, s.Events, "the late return is not recorded")
			}
			require.Len(t, b.tp.Named("dead_letter "+string(q)), 1, "the timeout writes every lease in one call")
		})

		t.Run(string(q)+"/LostLeases", func(t *testing.T) {
			t.Parallel()
			b := setupTracing(t, q)
			_, spans := b.loseBatch(t, processor.Options{}, func(ctx context.Context, leases []leasing.Lease) []error {
				return repeat(len(leases), context.Cause(ctx))
			})
			for _, s := range spans {
				require.Equal(t, attribute.StringValue("lost"), s.Attributes["messaging.leasestore.process.result"])
				require.Equal(t, attribute.StringValue("lease_lost"), s.Attributes["error.type"])
				require.Equal(t, codes.Error, s.Status)
				_, written := s.Attributes["messaging.leasestore.write.outcome"]
				require.False(t, written, "nothing is written for a lost lease")
			}
		})

		t.Run(string(q)+"/LostThenPastTimeoutIsNoTimeout", func(t *testing.T) {
			t.Parallel()
			b := setupTracing(t, q)
			// Long enough that the leases are lost before it passes (a
			// claim as another worker and a renew; 20 ms was too short for
			// a loaded machine, whose call then timed out first).
			const timeout = 500 * time.Millisecond
			batch, spans := b.loseBatch(t, processor.Options{HandlerTimeout: timeout}, func(_ context.Context, leases []leasing.Lease) []error {
				time.Sleep(2 * timeout) // a handler that ignores ctx, returning past HandlerTimeout
				return repeat(len(leases), nil)
			})
			_, marked := batch.Attributes["error.type"]
			require.False(t, marked, "no lease was timed out, so the call was not")
			require.Empty(t, batch.Events)
			require.Equal(t, codes.Unset, batch.Status)
			for _, s := range spans {
				require.Equal(t, attribute.StringValue("lost"), s.Attributes["messaging.leasestore.process.result"])
			}
		})

		t.Run(string(q)+"/Shutdown", func(t *testing.T) {
			t.Parallel()
			b := setupTracing(t, q)
			ids, sends := b.enqueueBatch(t, "a", "b")
			started := make(chan trace.SpanContext, 1)
			r := b.startBatch(t, b.store, func(ctx context.Context, leases []leasing.Lease) []error {
				started <- trace.SpanContextFromContext(ctx)
				<-ctx.Done()
				return repeat(len(leases), ctx.Err())
			}, processor.Options{TracerProvider: b.tp, ShutdownGrace: 10 * time.Millisecond})
			handlerSpan := <-started
			require.NoError(t, r.stop(t))
			_, spans := b.requireBatch(t, ids, sends, handlerSpan)
			for _, s := range spans {
				require.Equal(t, attribute.StringValue("failed"), s.Attributes["messaging.leasestore.process.result"])
				require.Equal(t, attribute.StringValue("shutdown"), s.Attributes["error.type"])
			}
		})

		t.Run(string(q)+"/AttemptsExhaustedWithoutACall", func(t *testing.T) {
			t.Parallel()
			b := setupTracing(t, q)
			id, send := b.enqueueTraced(t, "crashed")
			require.Len(t, b.claimAsOther(t), 1) // attempt 1, never finished
			b.clock.Advance(time.Minute)
			calls := make(chan int, 1)
			b.startBatch(t, b.store, func(_ context.Context, leases []leasing.Lease) []error {
				calls <- len(leases)
				return allNil(len(leases))
			}, processor.Options{TracerProvider: b.tp, RetryPolicy: processor.RetryPolicy{MaxAttempts: 1}})
			waitFor(t, statusIs(b.mem, id, leasing.StatusDeadLettered), "dead-lettered")
			waitFor(t, func() bool { return len(b.process(id)) == 1 }, "process span ended")
			s := b.process(id)[0]
			b.requireProcess(t, s, send, 2)
			require.Equal(t, attribute.StringValue("dead_lettered"), s.Attributes["messaging.leasestore.process.result"])
			require.Equal(t, attribute.StringValue("attempts_exhausted"), s.Attributes["error.type"])
			require.Empty(t, b.batchSpans(), "no call, no batch span")
			require.Empty(t, calls)
		})

		t.Run(string(q)+"/Off", func(t *testing.T) {
			t.Parallel()
			b := setupTracing(t, q)
			id, _ := b.enqueueTraced(t, "ok")
			handlerSpan := make(chan trace.SpanContext, 1)
			b.startBatch(t, b.store, func(ctx context.Context, leases []leasing.Lease) []error {
				handlerSpan <- trace.SpanContextFromContext(ctx)
				return allNil(len(leases))
			}, processor.Options{})
			waitFor(t, statusIs(b.mem, id, q.Succeeded()), "handled")
			require.False(t, (<-handlerSpan).IsValid(), "no span without a TracerProvider")
			require.Empty(t, b.tp.Named("process "+string(q)))
		})
	}
}
