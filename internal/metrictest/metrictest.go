// Package metrictest records what the library reports through an
// OpenTelemetry metric API meter, for the tests of the library's own
// module. That module depends on the OpenTelemetry API only, so that
// programs importing leasestore do not pull in the SDK; the suites of the
// integration module read the same instruments through the SDK's manual
// reader.
//
// A Provider records Int64Counter additions, Float64Histogram and
// Int64Gauge records, and observes the observable gauges registered with
// Meter.RegisterCallback; every other instrument is a no-op.
package metrictest

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// Provider is a metric.MeterProvider whose meters record into it. Its
// methods are safe for concurrent use. The zero value is not usable: call
// NewProvider.
type Provider struct {
	noop.MeterProvider

	mu        sync.Mutex
	sums      map[string]int64
	records   map[string][]Point
	units     map[string]string
	buckets   map[string][]float64
	callbacks map[*registration]metric.Callback
}

// NewProvider returns an empty Provider.
func NewProvider() *Provider {
	return &Provider{
		sums: map[string]int64{}, records: map[string][]Point{}, units: map[string]string{}, buckets: map[string][]float64{},
		callbacks: map[*registration]metric.Callback{}}
}

// Meter returns a meter that records into p; the name and options are
// ignored, so that meters of one provider share their instruments by name.
func (p *Provider) Meter(string, ...metric.MeterOption) metric.Meter {
	return meter{p: p}
}

// Sum returns the total of every Add on the Int64Counters named name,
// whatever their attributes; 0 when there was none.
func (p *Provider) Sum(name string) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sums[name]
}

// Records returns the values recorded on the Float64Histograms or
// Int64Gauges named name, in record order, with their attributes; nil when there was none.
func (p *Provider) Records(name string) []Point {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Point(nil), p.records[name]...)
}

// Histogram returns the unit and the explicit bucket boundaries the
// Float64Histogram named name was last made with, and whether one was.
func (p *Provider) Histogram(name string) (unit string, buckets []float64, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	unit, ok = p.units[name]
	return unit, append([]float64(nil), p.buckets[name]...), ok
}

// Point is one observation of a gauge or one histogram record.
type Point struct {
	// Attributes are the observation's attributes.
	Attributes attribute.Set
	// Value is the observed value (int64 gauges converted).
	Value float64
}

// Observe runs every registered callback once, as a collection would, and
// returns the observations by instrument name, in observation order.
//
// Errors: the first error a callback returned; every callback runs and
// the points observed are returned with it.
func (p *Provider) Observe(ctx context.Context) (map[string][]Point, error) {
	p.mu.Lock()
	callbacks := make([]metric.Callback, 0, len(p.callbacks))
	for _, cb := range p.callbacks {
		callbacks = append(callbacks, cb)
	}
	p.mu.Unlock()
	o := &observer{points: map[string][]Point{}}
	var firstErr error
	for _, cb := range callbacks {
		if err := cb(ctx, o); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return o.points, firstErr
}

func (p *Provider) add(name string, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sums[name] += n
}

// meter builds the recording instruments on its provider.
type meter struct {
	noop.Meter
	p *Provider
}

func (m meter) Int64Counter(name string, _ ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	return int64Counter{p: m.p, name: name}, nil
}

func (m meter) Float64Histogram(name string, opts ...metric.Float64HistogramOption) (metric.Float64Histogram, error) {
	cfg := metric.NewFloat64HistogramConfig(opts...)
	m.p.mu.Lock()
	defer m.p.mu.Unlock()
	m.p.units[name] = cfg.Unit()
	m.p.buckets[name] = cfg.ExplicitBucketBoundaries()
	return float64Histogram{p: m.p, name: name}, nil
}

func (m meter) Int64Gauge(name string, _ ...metric.Int64GaugeOption) (metric.Int64Gauge, error) {
	return int64SyncGauge{p: m.p, name: name}, nil
}

func (m meter) Int64ObservableGauge(name string, _ ...metric.Int64ObservableGaugeOption) (metric.Int64ObservableGauge, error) {
	return &int64Gauge{name: name}, nil
}

func (m meter) Float64ObservableGauge(name string, _ ...metric.Float64ObservableGaugeOption) (metric.Float64ObservableGauge, error) {
	return &float64Gauge{name: name}, nil
}

func (m meter) RegisterCallback(cb metric.Callback, _ ...metric.Observable) (metric.Registration, error) {
	r := &registration{p: m.p}
	m.p.mu.Lock()
	defer m.p.mu.Unlock()
	m.p.callbacks[r] = cb
	return r, nil
}

type int64Counter struct {
	noop.Int64Counter
	p    *Provider
	name string
}

func (c int64Counter) Add(_ context.Context, n int64, _ ...metric.AddOption) { c.p.add(c.name, n) }

func (c int64Counter) Enabled(context.Context) bool { return true }

type float64Histogram struct {
	noop.Float64Histogram
	p    *Provider
	name string
}

func (h float64Histogram) Record(_ context.Context, v float64, opts ...metric.RecordOption) {
	h.p.mu.Lock()
	defer h.p.mu.Unlock()
	h.p.records[h.name] = append(h.p.records[h.name], Point{Attributes: metric.NewRecordConfig(opts).Attributes(), Value: v})
}

func (h float64Histogram) Enabled(context.Context) bool { return true }

// int64SyncGauge records into its provider's records, as a histogram does.
type int64SyncGauge struct {
	noop.Int64Gauge
	p    *Provider
	name string
}

func (g int64SyncGauge) Record(_ context.Context, v int64, opts ...metric.RecordOption) {
	g.p.mu.Lock()
	defer g.p.mu.Unlock()
	g.p.records[g.name] = append(g.p.records[g.name], Point{Attributes: metric.NewRecordConfig(opts).Attributes(), Value: float64(v)})
}

func (g int64SyncGauge) Enabled(context.Context) bool { return true }

type int64Gauge struct {
	noop.Int64ObservableGauge
	name string
}

type float64Gauge struct {
	noop.Float64ObservableGauge
	name string
}

type registration struct {
	noop.Registration
	p *Provider
}

func (r *registration) Unregister() error {
	r.p.mu.Lock()
	defer r.p.mu.Unlock()
	delete(r.p.callbacks, r)
	return nil
}

// observer records what a callback observes on the recording gauges.
type observer struct {
	noop.Observer
	points map[string][]Point
}

func (o *observer) ObserveInt64(inst metric.Int64Observable, v int64, opts ...metric.ObserveOption) {
	if g, ok := inst.(*int64Gauge); ok {
		o.record(g.name, float64(v), opts)
	}
}

func (o *observer) ObserveFloat64(inst metric.Float64Observable, v float64, opts ...metric.ObserveOption) {
	if g, ok := inst.(*float64Gauge); ok {
		o.record(g.name, v, opts)
	}
}

func (o *observer) record(name string, v float64, opts []metric.ObserveOption) {
	o.points[name] = append(o.points[name], Point{Attributes: metric.NewObserveConfig(opts).Attributes(), Value: v})
}
