package processor

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/leasestore/leasestore/leasing"
)

// instrumentationScope is the meter name New uses when it makes its own
// no-op meter; callers pass their meter in Options.Meter.
const instrumentationScope = "github.com/leasestore/leasestore/leasing/processor"

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

// metrics are a processor's counters, all Int64Counter with unit
// {message}, named litebus.<queue>.processor.<name>.
type metrics struct {
	acquired     metric.Int64Counter // leases_acquired: leases a claim returned
	lost         metric.Int64Counter // lease_lost: leases a renew (or claim) found lost
	succeeded    metric.Int64Counter // succeeded / published: success outcome written
	failed       metric.Int64Counter // failed: failed outcome written
	deadLettered metric.Int64Counter // dead_lettered: dead_lettered outcome written
	skipped      metric.Int64Counter // persist_skipped: outcome not written, lease lost
	rejected     metric.Int64Counter // persist_rejected: the fence refused the write
	parked       metric.Int64Counter // parked: rows a claim dead-lettered as unclaimable (leasing.ParkedError)
}

// newMetrics makes the counters of a processor of queue q on meter; nil
// makes no-op counters.
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
	m := &metrics{
		acquired:     counter("processor.leases_acquired", "Leases taken by claims."),
		lost:         counter("processor.lease_lost", "Leases found lost by a renew; their handler was cancelled."),
		succeeded:    counter(SucceededCounter(q), "Messages whose success state was written."),
		failed:       counter("processor.failed", "Messages written as failed, to be retried after a backoff."),
		deadLettered: counter("processor.dead_lettered", "Messages written as dead_lettered."),
		skipped:      counter("processor.persist_skipped", "Outcomes not written because the lease was lost."),
		rejected:     counter("processor.persist_rejected", "Outcome writes the lease fence refused (lost, terminal or not found)."),
		parked:       counter("processor.parked", "Messages a claim could not lease and dead-lettered instead (leasing.ParkedError)."),
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

// RegisterQueueGauges registers observable gauges for each store's queue on
// meter and feeds them from leasing.Store.Stats, once per store on every
// collection:
//
//   - litebus.<queue>.queue.depth, Int64ObservableGauge, unit {message}: rows
//     per status, attribute "status" (every status of the queue, 0 included);
//   - litebus.<queue>.queue.expired_leases, Int64ObservableGauge, unit
//     {lease}: in-flight rows whose lease expired and that no claim has
//     reclaimed yet;
//   - litebus.<queue>.queue.oldest_due_age, Float64ObservableGauge, unit s:
//     seconds since the oldest due row was created, 0 when none is due.
//
// Values are read at the store's clock. A Stats error leaves that store's
// gauges unobserved for the collection and is returned from the callback
// (the SDK hands it to its error handler). leasing.Postgres.Stats scans the
// table, so collect every few seconds at most. Unregister the returned
// Registration to stop observing.
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
		all = append(all, g)
		instruments = append(instruments, g.depth, g.expired, g.oldest)
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
		}
		return errors.Join(errs...)
	}, instruments...)
	if err != nil {
		return nil, fmt.Errorf("processor: queue gauges: %w", err)
	}
	return reg, nil
}
