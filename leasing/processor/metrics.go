package processor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/leasestore/leasestore/leasing"
)

// MetricName returns the name of a queue's instrument: "litebus.<queue>.<name>",
// e.g. MetricName(leasing.Inbox, "processor.lease_lost") is
// "litebus.inbox.processor.lease_lost".
func MetricName(q leasing.Queue, name string) string {
	return "litebus." + string(q) + "." + name
}

// SucceededCounter returns the processor counter name for successful
// outcomes on q: "succeeded" on the inbox, "published" on the outbox.
func SucceededCounter(q leasing.Queue) string {
	if q == leasing.Outbox {
		return "processor.published"
	}
	return "processor.succeeded"
}

// Histogram bucket boundaries in seconds (docs/processor.md says why); a
// MeterProvider view may replace them.
var (
	// handler_duration: 1 ms to 5 minutes.
	handlerDurationBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	// queue_lag: 1 ms to 1 hour.
	queueLagBuckets = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}
	// claim_duration and write_duration: 0.5 ms to 30 seconds.
	storeCallBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
)

// metrics are a processor's instruments, litebus.<queue>.processor.<name>.
type metrics struct {
	acquired     metric.Int64Counter // leases_acquired: leases a claim returned
	lost         metric.Int64Counter // lease_lost: leases given up as lost (book.markLost)
	succeeded    metric.Int64Counter // succeeded / published: success outcome written
	failed       metric.Int64Counter // failed: failed outcome written
	deadLettered metric.Int64Counter // dead_lettered: dead_lettered outcome written
	skipped      metric.Int64Counter // persist_skipped: outcome not written, lease lost
	rejected     metric.Int64Counter // persist_rejected: the fence refused the write
	parked       metric.Int64Counter // parked: rows a claim dead-lettered as unclaimable (leasing.ParkedError)
	released     metric.Int64Counter // released: released by a verdict (retry after, unavailable), attempt returned

	breakerState       metric.Int64Gauge   // breaker_state: 1 open, 0 closed, attribute topic
	breakerTransitions metric.Int64Counter // breaker_transitions: attributes topic and state (the new one)

	handlerDuration metric.Float64Histogram // handler_duration: one handler call, attribute result
	queueLag        metric.Float64Histogram // queue_lag: due to claimed, store clock
	claimDuration   metric.Float64Histogram // claim_duration: one Claim call
	writeDuration   metric.Float64Histogram // write_duration: one outcome-write call, attribute operation
}

// newMetrics makes the instruments of queue q on meter; nil makes no-ops.
func newMetrics(meter metric.Meter, q leasing.Queue) (*metrics, error) {
	if meter == nil {
		meter = noop.NewMeterProvider().Meter(instrumentationScope)
	}
	var errs []error
	counter := func(name, desc string) metric.Int64Counter {
		c, err := meter.Int64Counter(MetricName(q, name), metric.WithUnit("{message}"), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	histogram := func(name string, buckets []float64, desc string) metric.Float64Histogram {
		h, err := meter.Float64Histogram(MetricName(q, name), metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(buckets...))
		errs = append(errs, err)
		return h
	}
	gauge := func(name, desc string) metric.Int64Gauge {
		g, err := meter.Int64Gauge(MetricName(q, name), metric.WithUnit("1"), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	transitions := func(name, desc string) metric.Int64Counter {
		c, err := meter.Int64Counter(MetricName(q, name), metric.WithUnit("{transition}"), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	m := &metrics{
		acquired:     counter("processor.leases_acquired", "Leases taken by claims."),
		lost:         counter("processor.lease_lost", "Leases given up as lost: a renew found them lost, they could not be renewed in time, or a claim took their message again; their handler was cancelled."),
		succeeded:    counter(SucceededCounter(q), "Messages whose success state was written."),
		failed:       counter("processor.failed", "Messages written as failed, to be retried after a backoff."),
		deadLettered: counter("processor.dead_lettered", "Messages written as dead_lettered."),
		skipped:      counter("processor.persist_skipped", "Outcomes not written because the lease was lost."),
		rejected:     counter("processor.persist_rejected", "Outcome writes the lease fence refused (lost, terminal or not found)."),
		parked:       counter("processor.parked", "Messages a claim could not lease and dead-lettered instead (leasing.ParkedError)."),
		released: counter("processor.released",
			"Messages released by a handler verdict (RetryAfter, Unavailable), due again after a delay, their attempt returned."),

		breakerState: gauge("processor.breaker_state",
			"State of the processor's breaker for a topic (outbox) or message type (inbox): 1 open, 0 closed."),
		breakerTransitions: transitions("processor.breaker_transitions",
			"Times a breaker opened or closed, attribute state: the new state."),

		handlerDuration: histogram("processor.handler_duration", handlerDurationBuckets,
			"Time one handler call took, from its start on a worker to its return, in seconds."),
		queueLag: histogram("processor.queue_lag", queueLagBuckets,
			"Time from a message being due to its claim, on the store's clock, in seconds."),
		claimDuration: histogram("processor.claim_duration", storeCallBuckets,
			"Time one Claim call took, as the processor saw it, in seconds."),
		writeDuration: histogram("processor.write_duration", storeCallBuckets,
			"Time one outcome-write call (release, complete, fail, dead letter) took, as the processor saw it, in seconds."),
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("processor: metrics: %w", err)
	}
	return m, nil
}

// count adds n to counter c.
func count(c metric.Int64Counter, n int) {
	if n > 0 {
		c.Add(context.Background(), int64(n))
	}
}

// writeOperations name the write kinds in metric attributes and log records.
var writeOperations = [...]string{
	writeRelease: "release", writeComplete: "complete", writeFail: "fail", writeDeadLetter: "dead_letter",
	writeReleaseAfter: "release_after", writeCommitted: "complete",
}

// Attribute values of the histograms, as option slices: a Record call
// passes one with ... and allocates no slice of its own per message.
var (
	resultSuccess  = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("result", "success")))}
	resultError    = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("result", "error")))}
	writeOperation = func() (opts [len(writeOperations)][]metric.RecordOption) {
		for kind, name := range writeOperations {
			opts[kind] = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("operation", name)))}
		}
		return opts
	}()
)

// observeBreaker records a breaker of topic entering state.
func (m *metrics) observeBreaker(topic string, state BreakerState) {
	ctx := context.Background()
	m.breakerState.Record(ctx, int64(state), metric.WithAttributes(attribute.String(LogKeyTopic, topic)))
	m.breakerTransitions.Add(ctx, 1, metric.WithAttributes(attribute.String(LogKeyTopic, topic), attribute.String("state", state.String())))
}

// observeClaim records a Claim call that took took and its leases'
// queue_lag, on the store's clock alone: a lease was claimed at its
// ExpiresAt less leaseFor. Leases without a DueAt are not recorded.
func (m *metrics) observeClaim(took time.Duration, leases []leasing.Lease, leaseFor time.Duration) {
	ctx := context.Background()
	m.claimDuration.Record(ctx, took.Seconds())
	leaseFor = leaseFor.Truncate(time.Microsecond)
	for _, l := range leases {
		if l.DueAt.IsZero() {
			continue
		}
		m.queueLag.Record(ctx, max(l.ExpiresAt.Sub(l.DueAt)-leaseFor, 0).Seconds())
	}
}

// observeHandler records, deferred, the handler_duration of a call that
// started at start, with the result of *err (success or error).
func (m *metrics) observeHandler(start time.Time, err *error) {
	opts := resultSuccess
	if *err != nil {
		opts = resultError
	}
	m.handlerDuration.Record(context.Background(), time.Since(start).Seconds(), opts...)
}

// timedWrite returns call recording the write_duration of each try.
func (m *metrics) timedWrite(kind writeKind, call storeWrite) storeWrite {
	return func(ctx context.Context) (leasing.WriteResult, error) {
		start := time.Now()
		res, err := call(ctx)
		m.writeDuration.Record(context.Background(), time.Since(start).Seconds(), writeOperation[kind]...)
		return res, err
	}
}

// pausedLister is a store that lists its queue's pauses: leasing.Postgres
// and leasing.Memory.
type pausedLister interface {
	Paused(ctx context.Context) ([]leasing.Pause, error)
}

// RegisterQueueGauges registers the litebus.<queue>.queue.* gauges
// (docs/processor.md lists them) for each store's queue on meter, fed from
// leasing.Store.Stats once per store on every collection. A Stats error
// leaves that store's gauges unobserved and is returned from the callback.
// leasing.Postgres.Stats scans the table: collect every few seconds at
// most. Unregister the returned Registration to stop observing.
//
// Errors: a *leasing.ArgumentError for a nil meter, no stores, a nil store
// or two stores of one queue; else the meter's instrument errors.
func RegisterQueueGauges(meter metric.Meter, stores ...leasing.Store) (metric.Registration, error) {
	if meter == nil {
		return nil, argumentError("meter", "must not be nil")
	}
	if len(stores) == 0 {
		return nil, argumentError("stores", "must hold at least one store")
	}
	type gauges struct {
		store   leasing.Store
		depth   metric.Int64ObservableGauge
		expired metric.Int64ObservableGauge
		oldest  metric.Float64ObservableGauge
		waiting metric.Int64ObservableGauge
		head    metric.Float64ObservableGauge
		paused  metric.Int64ObservableGauge // nil: the store cannot pause
	}
	var (
		all         []gauges
		instruments []metric.Observable
		errs        []error
		seen        = map[leasing.Queue]bool{}
	)
	for _, s := range stores {
		if s == nil {
			return nil, argumentError("stores", "must not hold a nil store")
		}
		q := s.Queue()
		if seen[q] {
			return nil, argumentError("stores", "two stores serve the %s queue; their gauges would collide", q)
		}
		seen[q] = true
		g := gauges{store: s}
		var err error
		g.depth, err = meter.Int64ObservableGauge(MetricName(q, "queue.depth"),
			metric.WithUnit("{message}"), metric.WithDescription("Rows per status."))
		errs = append(errs, err)
		g.expired, err = meter.Int64ObservableGauge(MetricName(q, "queue.expired_leases"),
			metric.WithUnit("{lease}"), metric.WithDescription("In-flight rows whose lease expired and that are not reclaimed yet."))
		errs = append(errs, err)
		g.oldest, err = meter.Float64ObservableGauge(MetricName(q, "queue.oldest_due_age"),
			metric.WithUnit("s"), metric.WithDescription("Age of the oldest due row, in seconds."))
		errs = append(errs, err)
		g.waiting, err = meter.Int64ObservableGauge(MetricName(q, "queue.waiting"),
			metric.WithUnit("{message}"), metric.WithDescription("Messages waiting behind their ordering key's head."))
		errs = append(errs, err)
		g.head, err = meter.Float64ObservableGauge(MetricName(q, "queue.oldest_head_age"),
			metric.WithUnit("s"), metric.WithDescription("How long the ordering key head that messages have waited behind longest has held its key, in seconds; 0 when none waits."))
		errs = append(errs, err)
		all = append(all, g)
		instruments = append(instruments, g.depth, g.expired, g.oldest, g.waiting, g.head)
		if _, ok := s.(pausedLister); ok {
			g.paused, err = meter.Int64ObservableGauge(MetricName(q, "queue.paused"),
				metric.WithUnit("{pause}"), metric.WithDescription("Pauses in place (leasectl pause): each paused topic, and the whole queue, count one; 0 when every claim runs."))
			errs = append(errs, err)
			all[len(all)-1] = g
			instruments = append(instruments, g.paused)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("processor: queue gauges: %w", err)
	}
	reg, err := meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		var errs []error
		for _, g := range all {
			st, err := g.store.Stats(ctx)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			for _, status := range st.Queue.Statuses() {
				o.ObserveInt64(g.depth, st.Depth[status], metric.WithAttributes(attribute.String("status", string(status))))
			}
			o.ObserveInt64(g.expired, st.ExpiredLeases)
			o.ObserveFloat64(g.oldest, st.OldestDueAge.Seconds())
			o.ObserveInt64(g.waiting, st.Depth[leasing.StatusWaiting])
			o.ObserveFloat64(g.head, st.OldestHeadAge().Seconds())
			if g.paused != nil {
				paused, err := g.store.(pausedLister).Paused(ctx)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				o.ObserveInt64(g.paused, int64(len(paused)))
			}
		}
		return errors.Join(errs...)
	}, instruments...)
	if err != nil {
		return nil, fmt.Errorf("processor: queue gauges: %w", err)
	}
	return reg, nil
}
