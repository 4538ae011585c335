// Package logtest records the log/slog records the library writes, for the
// tests of the library and of the integration module.
package logtest

import (
	"context"
	"log/slog"
	"slices"
	"sync"
)

// Record is one log record as written: its level, message and attributes
// (those of Logger.With first, then the record's own; groups are flattened
// to "group.key").
type Record struct {
	Level   slog.Level
	Message string
	Attrs   map[string]slog.Value
}

// Str returns the string form of attribute key, "" when absent.
func (r Record) Str(key string) string {
	v, ok := r.Attrs[key]
	if !ok {
		return ""
	}
	return v.String()
}

// Recorder is a slog.Handler that keeps every record at Level or above.
// Safe for concurrent use. The zero value is not usable: call New.
type Recorder struct {
	level slog.Level
	mu    *sync.Mutex
	recs  *[]Record
	attrs []slog.Attr
	group string
}

// New returns a Recorder that keeps records at level or above.
func New(level slog.Level) *Recorder {
	return &Recorder{level: level, mu: &sync.Mutex{}, recs: &[]Record{}}
}

// Logger returns a *slog.Logger writing to r.
func (r *Recorder) Logger() *slog.Logger { return slog.New(r) }

// Enabled implements slog.Handler.
func (r *Recorder) Enabled(_ context.Context, l slog.Level) bool { return l >= r.level }

// Handle implements slog.Handler.
func (r *Recorder) Handle(_ context.Context, rec slog.Record) error {
	out := Record{Level: rec.Level, Message: rec.Message, Attrs: map[string]slog.Value{}}
	for _, a := range r.attrs {
		out.Attrs[a.Key] = a.Value.Resolve()
	}
	rec.Attrs(func(a slog.Attr) bool {
		out.Attrs[r.key(a.Key)] = a.Value.Resolve()
		return true
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	*r.recs = append(*r.recs, out)
	return nil
}

func (r *Recorder) key(k string) string {
	if r.group == "" {
		return k
	}
	return r.group + "." + k
}

// WithAttrs implements slog.Handler.
func (r *Recorder) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *r
	c.attrs = slices.Clone(r.attrs)
	for _, a := range attrs {
		c.attrs = append(c.attrs, slog.Attr{Key: r.key(a.Key), Value: a.Value})
	}
	return &c
}

// WithGroup implements slog.Handler.
func (r *Recorder) WithGroup(name string) slog.Handler {
	c := *r
	c.group = r.key(name)
	return &c
}

// Records returns the records kept so far, in write order.
func (r *Recorder) Records() []Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(*r.recs)
}

// Find returns the records whose message is msg.
func (r *Recorder) Find(msg string) []Record {
	var out []Record
	for _, rec := range r.Records() {
		if rec.Message == msg {
			out = append(out, rec)
		}
	}
	return out
}

// AtLeast returns the records at level or above.
func (r *Recorder) AtLeast(level slog.Level) []Record {
	var out []Record
	for _, rec := range r.Records() {
		if rec.Level >= level {
			out = append(out, rec)
		}
	}
	return out
}
