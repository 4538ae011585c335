package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// printTrace follows one outbox message from the request that enqueued it
// to its outcome and prints its spans as trees, one per trace: a traced
// store enqueues it in a transaction, a traced relay fails its first
// publish and publishes it on the second attempt, while the heartbeat
// renews its lease once.
func printTrace(ctx context.Context, out io.Writer, pool *pgxpool.Pool) error {
	recorder := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(recorder))
	defer func() { _ = tp.Shutdown(context.Background()) }()

	outbox, err := leasing.NewPostgres(pool, leasing.Outbox, leasing.PostgresOptions{TracerProvider: tp})
	if err != nil {
		return err
	}
	reqCtx, request := tp.Tracer("demo").Start(ctx, "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
	var id leasing.EnqueueResult
	err = pgx.BeginFunc(reqCtx, pool, func(tx pgx.Tx) error {
		// ... the order's INSERT on tx ...
		id, err = outbox.EnqueueTx(reqCtx, tx, leasing.NewMessage{Type: "order_placed", Topic: "orders", Payload: []byte(`{"order":4711}`)})
		return err
	})
	request.End()
	if err != nil {
		return err
	}

	var calls atomic.Int32
	published := make(chan struct{})
	publish := processor.Publisher(func(ctx context.Context, msg leasing.Message) error {
		_, span := tp.Tracer("demo").Start(ctx, "broker publish orders", trace.WithSpanKind(trace.SpanKindProducer))
		defer span.End()
		if calls.Add(1) == 1 {
			err := errors.New("broker unavailable")
			span.SetStatus(codes.Error, err.Error())
			return err
		}
		// A slow broker: the heartbeat renews the lease meanwhile. 250 ms
		// holds two heartbeat ticks, so that the first renew has at least
		// 150 ms to finish before the outcome is written, also on a slow
		// server (a renew took 101 ms in a run that held 150 ms).
		time.Sleep(250 * time.Millisecond)
		close(published)
		return nil
	})
	relay, err := processor.New(outbox, publish.Handler(), processor.Options{
		Owner: "demo-relay", TracerProvider: tp, LeaseDuration: 300 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond,
		PollInterval: 20 * time.Millisecond, RetryPolicy: processor.RetryPolicy{InitialDelay: 50 * time.Millisecond},
	})
	if err != nil {
		return err
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- relay.Run(runCtx) }()
	select {
	case <-published:
	case <-time.After(time.Minute):
	}
	deadline := time.Now().Add(time.Minute) // the outcome write ends the last span
	for !hasSpan(recorder, "complete outbox") && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	if err := <-ran; err != nil {
		return err
	}
	row, err := outbox.Get(ctx, id.IDs[0])
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nTrace of one outbox message, enqueue to outcome (headers %s; ⇠ links to):\n", row.Headers)
	printSpanTrees(out, recorder.Ended())
	if row.Status != leasing.StatusPublished {
		return fmt.Errorf("traced message is %s, want published", row.Status)
	}
	return nil
}

func hasSpan(r *tracetest.SpanRecorder, name string) bool {
	return slices.ContainsFunc(r.Ended(), func(s sdktrace.ReadOnlySpan) bool { return s.Name() == name })
}

// printSpanTrees prints spans as one tree per trace, traces and siblings
// in start order: name, kind, duration, the attributes that tell the
// attempts apart, and the spans each links to.
func printSpanTrees(out io.Writer, spans []sdktrace.ReadOnlySpan) {
	slices.SortFunc(spans, func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) })
	names := map[trace.SpanID]string{}
	children := map[trace.SpanID][]sdktrace.ReadOnlySpan{}
	var roots []sdktrace.ReadOnlySpan
	for _, s := range spans {
		names[s.SpanContext().SpanID()] = s.Name()
		if s.Parent().IsValid() {
			children[s.Parent().SpanID()] = append(children[s.Parent().SpanID()], s)
		} else {
			roots = append(roots, s)
		}
	}
	for _, s := range spans {
		if a := s.Attributes(); slices.ContainsFunc(a, func(kv attribute.KeyValue) bool { return kv.Key == "messaging.leasestore.attempt" }) {
			names[s.SpanContext().SpanID()] += fmt.Sprintf(" #%d", attrValue(a, "messaging.leasestore.attempt").AsInt64())
		}
	}
	var walk func(s sdktrace.ReadOnlySpan, depth int)
	walk = func(s sdktrace.ReadOnlySpan, depth int) {
		label := strings.Repeat("  ", depth) + s.Name()
		fmt.Fprintf(out, "    %-36s %-8s %8s  %s\n", label, s.SpanKind(), s.EndTime().Sub(s.StartTime()).Round(10*time.Microsecond), spanDetail(s, names))
		for _, c := range children[s.SpanContext().SpanID()] {
			walk(c, depth+1)
		}
	}
	for _, r := range roots {
		fmt.Fprintf(out, "  trace %s\n", r.SpanContext().TraceID())
		walk(r, 0)
	}
}

// spanDetail returns the attributes worth showing of s and its links.
func spanDetail(s sdktrace.ReadOnlySpan, names map[trace.SpanID]string) string {
	var parts []string
	for _, key := range []attribute.Key{"messaging.leasestore.attempt", "messaging.leasestore.lease.generation", "messaging.batch.message_count",
		"messaging.leasestore.process.result", "error.type", "messaging.leasestore.write.outcome", "messaging.leasestore.renew.renewed"} {
		if v := attrValue(s.Attributes(), key); v.Type() != attribute.EMPTY {
			short := strings.TrimPrefix(strings.TrimPrefix(string(key), "messaging.leasestore."), "messaging.batch.")
			parts = append(parts, short+"="+v.String())
		}
	}
	for _, l := range s.Links() {
		parts = append(parts, "⇠ "+cmp.Or(names[l.SpanContext.SpanID()], "span "+l.SpanContext.SpanID().String()))
	}
	return strings.Join(parts, " ")
}

func attrValue(attrs []attribute.KeyValue, key attribute.Key) attribute.Value {
	for _, kv := range attrs {
		if kv.Key == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// printHistograms prints each histogram of rm, data points of the same
// name and attributes summed over the meters: the count, the mean and
// the bucket bounds p50 and p99 fall under.
func printHistograms(out io.Writer, rm metricdata.ResourceMetrics) {
	type key struct{ name, attrs string }
	sums := map[key]*metricdata.HistogramDataPoint[float64]{}
	var order []key
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			h, ok := m.Data.(metricdata.Histogram[float64])
			if !ok {
				continue
			}
			for _, dp := range h.DataPoints {
				k := key{m.Name, dp.Attributes.Encoded(attribute.DefaultEncoder())}
				sum := sums[k]
				if sum == nil {
					sum = &metricdata.HistogramDataPoint[float64]{Bounds: dp.Bounds, BucketCounts: make([]uint64, len(dp.BucketCounts))}
					sums[k] = sum
					order = append(order, k)
				}
				sum.Count += dp.Count
				sum.Sum += dp.Sum
				for i, c := range dp.BucketCounts {
					sum.BucketCounts[i] += c
				}
			}
		}
	}
	slices.SortFunc(order, func(a, b key) int { return cmp.Or(cmp.Compare(a.name, b.name), cmp.Compare(a.attrs, b.attrs)) })
	fmt.Fprintln(out, "\nHistograms, both instances (seconds; p50/p99: the bucket bound they fall under):")
	for _, k := range order {
		dp := sums[k]
		fmt.Fprintf(out, "  %-44s %-20s count %5d  mean %8.4f  p50 ≤ %-7s p99 ≤ %s\n", k.name, k.attrs, dp.Count,
			dp.Sum/float64(max(dp.Count, 1)), quantileBound(*dp, 0.5), quantileBound(*dp, 0.99))
	}
}

// quantileBound returns the upper bound of the bucket quantile q of dp
// falls in, "+Inf" for the last.
func quantileBound(dp metricdata.HistogramDataPoint[float64], q float64) string {
	rank := uint64(q*float64(dp.Count) + 0.5)
	var seen uint64
	for i, c := range dp.BucketCounts {
		seen += c
		if seen >= max(rank, 1) {
			if i < len(dp.Bounds) {
				return fmt.Sprint(dp.Bounds[i])
			}
			break
		}
	}
	return "+Inf"
}
