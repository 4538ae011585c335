package console

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/leasestore/leasestore/leasing"
)

// historySpan is how far back the queues page's history reaches.
const historySpan = time.Hour

// defaultSampleEvery is Options.SampleEvery's default.
const defaultSampleEvery = 30 * time.Second

// minSampleEvery is the shortest Options.SampleEvery.
const minSampleEvery = 100 * time.Millisecond

// sample is one queue's Stats taken at At (the console's clock).
type sample struct {
	At        time.Time
	Depth     int64 // waiting, pending, in flight and failed
	Succeeded int64 // completed (inbox) or published (outbox)
}

// history is one queue's samples of the last historySpan, oldest first, in
// a ring of fixed capacity.
type history struct {
	ring  []sample
	next  int // where the next sample goes
	count int
}

func newHistory(every time.Duration) *history {
	return &history{ring: make([]sample, int(historySpan/every)+1)}
}

func (h *history) add(s sample) {
	h.ring[h.next] = s
	h.next = (h.next + 1) % len(h.ring)
	if h.count < len(h.ring) {
		h.count++
	}
}

// samples returns the samples, oldest first.
func (h *history) samples() []sample {
	out := make([]sample, 0, h.count)
	for i := range h.count {
		out = append(out, h.ring[(h.next-h.count+i+len(h.ring))%len(h.ring)])
	}
	return out
}

// sampler holds the histories and the Run/Close lifecycle.
type sampler struct {
	every time.Duration
	mu    sync.Mutex
	hist  map[leasing.Queue]*history
	since time.Time // first sample; zero before it

	runMu   sync.Mutex
	closed  bool
	stop    context.CancelFunc
	stopped chan struct{}
}

// Run samples every queue's Stats every Options.SampleEvery (the first at
// once) into the history of the last hour that the queues page shows, until
// ctx is done or Close is called; it returns nil then. A failed sample is
// logged to Options.Logger and skipped. Each sample costs what the queues
// page costs once: one Stats call per queue, which counts the queue's rows
// by status.
//
// Errors: Run already running, or the console closed; with
// Options.SampleEvery < 0 Run returns nil at once.
func (c *Console) Run(ctx context.Context) error {
	s := &c.sampler
	if s.every < 0 {
		return nil
	}
	s.runMu.Lock()
	if s.closed {
		s.runMu.Unlock()
		return fmt.Errorf("console: closed")
	}
	if s.stop != nil {
		s.runMu.Unlock()
		return fmt.Errorf("console: already running")
	}
	ctx, stop := context.WithCancel(ctx)
	stopped := make(chan struct{})
	s.stop, s.stopped = stop, stopped
	s.runMu.Unlock()
	defer func() {
		stop()
		s.runMu.Lock()
		s.stop, s.stopped = nil, nil
		s.runMu.Unlock()
		close(stopped)
	}()
	tick := time.NewTicker(s.every)
	defer tick.Stop()
	for {
		c.sample(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Close stops Run and waits for it to return; the console still serves
// its pages (the history stops growing). Calling it again, or without Run,
// does nothing. It returns nil.
func (c *Console) Close() error {
	s := &c.sampler
	s.runMu.Lock()
	s.closed = true
	stop, stopped := s.stop, s.stopped
	s.runMu.Unlock()
	if stop != nil {
		stop()
		<-stopped
	}
	return nil
}

// sample records one sample of every queue.
func (c *Console) sample(ctx context.Context) {
	for _, q := range c.queues {
		st, err := c.stores[q].Stats(ctx)
		if err != nil {
			if ctx.Err() == nil {
				c.opts.Logger.Warn("console: sample queue stats", "queue", string(q), "error", err)
			}
			continue
		}
		c.record(q, st, time.Now())
	}
}

// record adds st, taken at at, to q's history.
func (c *Console) record(q leasing.Queue, st leasing.Stats, at time.Time) {
	s := sample{At: at, Succeeded: st.Depth[q.Succeeded()]}
	for _, status := range []leasing.Status{leasing.StatusWaiting, leasing.StatusPending, q.InFlight(), leasing.StatusFailed} {
		s.Depth += st.Depth[status]
	}
	c.sampler.mu.Lock()
	defer c.sampler.mu.Unlock()
	if c.sampler.since.IsZero() {
		c.sampler.since = at
	}
	c.sampler.hist[q].add(s)
}

// historyView is one queue's history as the queues page draws it.
type historyView struct {
	// Label says what the history covers.
	Label string
	// Samples is how many samples there are.
	Samples int
	// DepthNow and DepthMax are the latest and largest depth.
	DepthNow, DepthMax int64
	// DepthPoints is the depth line's SVG polyline points.
	DepthPoints string
	// Rates are the messages succeeded per minute between samples, newest
	// last; "-" where the count fell (rows deleted).
	RateNow, RateMax string
	RatePoints       string
}

// chart geometry of the queues page's history charts, in SVG user units.
const chartW, chartH = 360.0, 60.0

// historyOf returns q's history for the queues page; nil before the first
// sample.
func (c *Console) historyOf(q leasing.Queue) *historyView {
	c.sampler.mu.Lock()
	samples := c.sampler.hist[q].samples()
	since := c.sampler.since
	c.sampler.mu.Unlock()
	if len(samples) == 0 {
		return nil
	}
	v := &historyView{Samples: len(samples)}
	v.Label = fmt.Sprintf("last hour, sampled every %s", c.sampler.every)
	if time.Since(since) < historySpan {
		v.Label = fmt.Sprintf("since this console started, sampled every %s", c.sampler.every)
	}
	x := func(at time.Time) float64 {
		return chartW * (1 - float64(samples[len(samples)-1].At.Sub(at))/float64(historySpan))
	}
	depths := make([]float64, len(samples))
	for i, s := range samples {
		depths[i] = float64(s.Depth)
		v.DepthMax = max(v.DepthMax, s.Depth)
	}
	v.DepthNow = samples[len(samples)-1].Depth
	v.DepthPoints = points(samples, depths, x)
	if len(samples) < 2 {
		v.RateNow, v.RateMax = "-", "-"
		return v
	}
	rates := make([]float64, len(samples)) // rates[0] unused
	rateMax, known := 0.0, false
	for i := 1; i < len(samples); i++ {
		d := samples[i].Succeeded - samples[i-1].Succeeded
		if d < 0 {
			rates[i] = -1
			continue
		}
		rates[i] = float64(d) / samples[i].At.Sub(samples[i-1].At).Minutes()
		rateMax, known = max(rateMax, rates[i]), true
	}
	v.RateNow, v.RateMax = "-", "-"
	if r := rates[len(rates)-1]; r >= 0 {
		v.RateNow = fmt.Sprintf("%.1f", r)
	}
	if known {
		v.RateMax = fmt.Sprintf("%.1f", rateMax)
	}
	v.RatePoints = points(samples[1:], rates[1:], x)
	return v
}

// points returns the SVG polyline points of values (negative ones left
// out) at the samples' times, scaled to the chart's height.
func points(samples []sample, values []float64, x func(time.Time) float64) string {
	top := 0.0
	for _, val := range values {
		top = max(top, val)
	}
	var b strings.Builder
	for i, val := range values {
		if val < 0 {
			continue
		}
		y := chartH
		if top > 0 {
			y = chartH * (1 - val/top)
		}
		fmt.Fprintf(&b, "%.1f,%.1f ", x(samples[i].At), y)
	}
	return strings.TrimSpace(b.String())
}
