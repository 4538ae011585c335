package processor

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/leasestore/leasestore/leasing"
)

// State is what a Processor is doing, as Health reports it.
type State string

// The processor states. A state is ready (Health.Ready) only when listed
// in readyStates, and live (Health.Live) unless listed in deadStates: a
// new state is one line here, plus one there when it is ready or dead.
const (
	// StateStarting: New returned, or Run has not yet found the store
	// usable (instance identity, schema and privilege checks); Reason says
	// what it waits for.
	StateStarting State = "starting"
	// StateRunning: Run claims and works messages.
	StateRunning State = "running"
	// StateSchemaBehind: the database lacks migrations or indexes this
	// version needs; Health.Err is the *leasing.SchemaError. Run waits for
	// the migration (or, with Options.FailOnSchemaBehind, returns it).
	StateSchemaBehind State = "schema_behind"
	// StatePrivilegesRefused: the store's role lacks a privilege; Run
	// returned (or is returning) the error, errors.Is
	// leasing.ErrPermissionDenied.
	StatePrivilegesRefused State = "privileges_refused"
	// StateInstanceInUse: another live process holds the processor's
	// Options.InstanceID; Run returned the *leasing.InstanceInUseError.
	StateInstanceInUse State = "instance_in_use"
	// StateStopping: shutdown started; running handlers finish and their
	// outcomes are written.
	StateStopping State = "stopping"
	// StateStopped: Run returned without a refusal.
	StateStopped State = "stopped"
)

// readyStates are the states in which a processor is ready.
var readyStates = map[State]bool{StateRunning: true}

// deadStates are the states in which a processor is not live: it will not
// claim again in this process.
var deadStates = map[State]bool{StatePrivilegesRefused: true, StateInstanceInUse: true, StateStopped: true}

// Health is a processor's state at one moment. Times are the process's
// clock (time.Now), not the database's: they say when this process last
// saw each event succeed, and are zero until it has.
type Health struct {
	// Queue is the processor's queue.
	Queue leasing.Queue `json:"queue"`
	// Owner is the processor's lease owner.
	Owner string `json:"owner"`
	// State is what the processor is doing.
	State State `json:"state"`
	// Since is when the processor entered State.
	Since time.Time `json:"since"`
	// Reason is Err's text; empty when Err is nil.
	Reason string `json:"reason,omitempty"`
	// Err is why the processor is not running: the *leasing.SchemaError,
	// the privilege or instance refusal, or the last error of a start
	// step tried again (StateStarting); nil when running.
	Err error `json:"-"`
	// Live is false once the processor will not claim again in this
	// process: it stopped, or was refused.
	Live bool `json:"live"`
	// Ready is true while the processor claims (StateRunning).
	Ready bool `json:"ready"`
	// LastClaim is when a claim last succeeded (whether or not it found
	// messages).
	LastClaim time.Time `json:"last_claim,omitzero"`
	// LastWrite is when an outcome write last succeeded.
	LastWrite time.Time `json:"last_write,omitzero"`
	// ListenerError is the last error of the processor's own Listener
	// (Options.DirectConfig), empty when it has none. The processor then
	// claims every PollInterval: it stays ready.
	ListenerError string `json:"listener_error,omitempty"`
	// ListenerSilent is true while the processor runs its own Listener
	// (Options.DirectConfig) and that Listener is not healthy
	// (leasing.Listener.Healthy: no LISTEN in place, or its connection
	// not heard from within its heartbeat bound) after it had connected
	// once. The processor then claims every PollInterval: it stays ready.
	ListenerSilent bool `json:"listener_silent,omitempty"`
	// ListenerHeard is when, by the process clock, the processor's own
	// Listener last heard from its connection (leasing.Listener.LastHeard);
	// zero without one, or before it first connected.
	ListenerHeard time.Time `json:"listener_heard,omitzero"`
	// OpenBreakers lists, sorted, the topics (outbox Topic, inbox Type;
	// "" for messages without one) whose breaker is open: their
	// destination reported Unavailable and only probes are claimed. The
	// processor stays ready: it claims its other topics.
	OpenBreakers []string `json:"open_breakers,omitempty"`
}

// health holds a processor's Health; its methods are safe for concurrent
// use.
type health struct {
	mu sync.Mutex
	h  Health
}

func newHealth(q leasing.Queue, owner string) *health {
	h := &health{h: Health{Queue: q, Owner: owner}}
	h.set(StateStarting, nil)
	return h
}

// set moves to state s for err and reports whether the state or the
// error's text changed. A dead state is final.
func (h *health) set(s State, err error) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if deadStates[h.h.State] {
		return false
	}
	reason := ""
	if err != nil {
		reason = err.Error()
	}
	changed := h.h.State != s || h.h.Reason != reason
	if h.h.State != s {
		h.h.Since = time.Now()
	}
	h.h.State, h.h.Err, h.h.Reason = s, err, reason
	return changed
}

// claimed records a claim that succeeded.
func (h *health) claimed() {
	h.mu.Lock()
	h.h.LastClaim = time.Now()
	h.mu.Unlock()
}

// wrote records an outcome write that succeeded.
func (h *health) wrote() {
	h.mu.Lock()
	h.h.LastWrite = time.Now()
	h.mu.Unlock()
}

// listener records the Listener's error err; nil clears it.
func (h *health) listener(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.h.ListenerError = ""
	if err != nil {
		h.h.ListenerError = err.Error()
	}
}

// get returns a copy of the health with Live and Ready set.
func (h *health) get() Health {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.h
	out.Live = !deadStates[out.State]
	out.Ready = readyStates[out.State]
	return out
}

// Health returns the processor's state now. Safe for concurrent use, also
// before Run and after it returned.
func (p *Processor) Health() Health {
	h := p.ev.health.get()
	h.OpenBreakers = p.breaker.openTopics()
	if l := p.listener; l != nil && h.State == StateRunning {
		h.ListenerHeard = l.LastHeard()
		h.ListenerSilent = !h.ListenerHeard.IsZero() && !l.Healthy()
	}
	return h
}

// HealthHandler returns an http.Handler that answers a platform's probes
// from the health of ps, each GET or HEAD whose path ends in:
//
//   - "/livez": 200 while every processor is live (Health.Live), else 503;
//   - "/readyz": 200 while every processor is ready (Health.Ready), else
//     503.
//
// The body is JSON, {"status": "ok" | "unavailable", "processors":
// [Health, ...]}, in the order of ps; Err appears as reason. Another path
// gets 404, another method 405. Mount it where the platform probes, e.g.
// mux.Handle("/healthz/", processor.HealthHandler(p)).
func HealthHandler(ps ...*Processor) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ok func(Health) bool
		switch {
		case strings.HasSuffix(r.URL.Path, "/livez"):
			ok = func(h Health) bool { return h.Live }
		case strings.HasSuffix(r.URL.Path, "/readyz"):
			ok = func(h Health) bool { return h.Ready }
		default:
			http.NotFound(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, http.StatusText(http.StatusMethodNotAllowed), http.StatusMethodNotAllowed)
			return
		}
		body := struct {
			Status     string   `json:"status"`
			Processors []Health `json:"processors"`
		}{Status: "ok", Processors: make([]Health, len(ps))}
		code := http.StatusOK
		for i, p := range ps {
			body.Processors[i] = p.Health()
			if !ok(body.Processors[i]) {
				body.Status, code = "unavailable", http.StatusServiceUnavailable
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(body) // the client went away: nothing to do
	})
}
