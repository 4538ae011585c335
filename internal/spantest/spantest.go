// Package spantest records the spans the library starts through an
// OpenTelemetry trace API TracerProvider, for the tests of the library's
// own module. That module depends on the OpenTelemetry API only, so that
// programs importing leasestore do not pull in the SDK; the suites of the
// integration module record the same spans with the SDK's
// tracetest.SpanRecorder.
//
// A Provider gives every span a valid, sampled span context: the trace id
// of its parent (a new one for a root), a new span id. It keeps every span
// started, so that Check can tell a span never ended, or ended twice.
package spantest

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
)

// Provider is a trace.TracerProvider whose tracers record into it. Its
// methods are safe for concurrent use. The zero value is not usable: call
// NewProvider.
type Provider struct {
	embedded.TracerProvider

	mu      sync.Mutex
	next    uint64
	started []*span // in start order
	ended   []Span
}

// NewProvider returns an empty Provider.
func NewProvider() *Provider { return &Provider{} }

// Tracer returns a tracer that records into p; the name and options are
// ignored.
func (p *Provider) Tracer(string, ...trace.TracerOption) trace.Tracer { return tracer{p: p} }

// Ended returns a copy of the spans ended so far, in end order.
func (p *Provider) Ended() []Span {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Span(nil), p.ended...)
}

// Named returns the ended spans named name, in end order.
func (p *Provider) Named(name string) []Span {
	var out []Span
	for _, s := range p.Ended() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

// Check returns an error naming every span started so far that has not
// ended, or that ended more than once; nil when each ended exactly once.
// Call it once the code under test has stopped (t.Cleanup).
func (p *Provider) Check() error {
	p.mu.Lock()
	started := append([]*span(nil), p.started...)
	p.mu.Unlock()
	var problems []string
	for _, s := range started {
		s.mu.Lock()
		name, ends := s.data.Name, s.ends
		s.mu.Unlock()
		if ends != 1 {
			problems = append(problems, fmt.Sprintf("%q ended %d times", name, ends))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("spantest: %d of %d spans not ended exactly once: %s", len(problems), len(started), strings.Join(problems, "; "))
	}
	return nil
}

func (p *Provider) id() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.next++
	return p.next
}

// Span is what a span recorded, as of its End.
type Span struct {
	Name        string
	Kind        trace.SpanKind
	SpanContext trace.SpanContext
	Parent      trace.SpanContext // invalid for a root
	Attributes  map[attribute.Key]attribute.Value
	Links       []trace.Link
	Events      []string // names, in order; RecordError adds "exception"
	Status      codes.Code
	Description string // of the status
}

type tracer struct {
	embedded.Tracer
	p *Provider
}

func (t tracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	cfg := trace.NewSpanStartConfig(opts...)
	var parent trace.SpanContext
	if !cfg.NewRoot() {
		parent = trace.SpanContextFromContext(ctx)
	}
	var tid trace.TraceID
	if parent.IsValid() {
		tid = parent.TraceID()
	} else {
		binary.BigEndian.PutUint64(tid[8:], t.p.id())
	}
	var sid trace.SpanID
	binary.BigEndian.PutUint64(sid[:], t.p.id())
	s := &span{p: t.p, data: Span{
		Name: name, Kind: cfg.SpanKind(), Parent: parent, Attributes: map[attribute.Key]attribute.Value{},
		SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}),
		Links:       append([]trace.Link(nil), cfg.Links()...),
	}}
	s.SetAttributes(cfg.Attributes()...)
	t.p.mu.Lock()
	t.p.started = append(t.p.started, s)
	t.p.mu.Unlock()
	return trace.ContextWithSpan(ctx, s), s
}

type span struct {
	embedded.Span
	p *Provider

	mu    sync.Mutex
	data  Span
	ended bool
	ends  int // End calls; Check wants exactly one
}

// End records the span as of its first End; a later End changes nothing
// but is counted, for Check.
func (s *span) End(...trace.SpanEndOption) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ends++
	if s.ended {
		return
	}
	s.ended = true
	d := s.data
	d.Attributes = make(map[attribute.Key]attribute.Value, len(s.data.Attributes))
	for k, v := range s.data.Attributes {
		d.Attributes[k] = v
	}
	s.p.mu.Lock()
	s.p.ended = append(s.p.ended, d)
	s.p.mu.Unlock()
}

// update runs f on the span's data unless it ended.
func (s *span) update(f func(*Span)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		f(&s.data)
	}
}

func (s *span) AddEvent(name string, _ ...trace.EventOption) {
	s.update(func(d *Span) { d.Events = append(d.Events, name) })
}

func (s *span) AddLink(l trace.Link) { s.update(func(d *Span) { d.Links = append(d.Links, l) }) }

func (s *span) IsRecording() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.ended
}

func (s *span) RecordError(error, ...trace.EventOption) { s.AddEvent("exception") }

func (s *span) SpanContext() trace.SpanContext { return s.data.SpanContext } // set once, by Start

func (s *span) SetStatus(code codes.Code, description string) {
	s.update(func(d *Span) { d.Status, d.Description = code, description })
}

func (s *span) SetName(name string) { s.update(func(d *Span) { d.Name = name }) }

func (s *span) SetAttributes(kv ...attribute.KeyValue) {
	s.update(func(d *Span) {
		for _, a := range kv {
			d.Attributes[a.Key] = a.Value
		}
	})
}

func (s *span) TracerProvider() trace.TracerProvider { return s.p }
