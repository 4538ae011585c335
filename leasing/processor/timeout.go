package processor

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/leasestore/leasestore/leasing"
)

// timedCall is one handler call under HandlerTimeout: New's call over
// lease, or NewBatch's over batch with its span and cancel. Its fields
// other than lease, batch, span and cancel belong to the run's timeouts,
// under timeouts.mu, but for timedOut, which fire writes while firing is
// set and stop reads once it is cleared.
type timedCall struct {
	prev, next *timedCall // in timeouts' list of running calls
	deadline   time.Time
	timedOut   bool // the timeout fired while the call ran and ended a lease
	firing     bool // fire took the call off the list and has not yet submitted its outcomes

	lease  *heldLease              // New's call: its one lease
	batch  []*heldLease            // NewBatch's call: its leases
	span   trace.Span              // NewBatch's call: its span
	cancel context.CancelCauseFunc // NewBatch's call: cancels its context
}

// leases returns the leases of c's call.
func (c *timedCall) leases() []*heldLease {
	if c.lease != nil {
		return []*heldLease{c.lease}
	}
	return c.batch
}

// timeouts watches the HandlerTimeout of one run's handler calls with one
// timer, rather than one per call. Every call has the same timeout, so
// calls reach their deadlines in the order they started: running calls
// are a list in start order, the timer is set for the first one's deadline,
// and a call that returns leaves the list wherever it is. mu is its own.
// The timeouts' outcomes are submitted without mu, so that one waiting for
// a busy writer delays no other call's timeout; a call's stop waits for
// its own.
type timeouts struct {
	r *run
	d time.Duration // HandlerTimeout; NoHandlerTimeout watches nothing

	mu    sync.Mutex
	list  timedCall   // sentinel: list.next is the oldest running call
	timer *time.Timer // fires fire; nil until the first call
	armed bool        // timer is set for a call's deadline
	fired sync.Cond   // on mu: fire submitted the outcomes of the calls it took
}

func newTimeouts(r *run, d time.Duration) *timeouts {
	t := &timeouts{r: r, d: d}
	t.list.prev, t.list.next = &t.list, &t.list
	t.fired.L = &t.mu
	return t
}

// start starts watching c, a call that starts now.
func (t *timeouts) start(c *timedCall) {
	if t.d == NoHandlerTimeout {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	c.deadline = time.Now().Add(t.d)
	c.prev, c.next = t.list.prev, &t.list
	c.prev.next, t.list.prev = c, c
	if t.armed {
		return // the timer is set for an older call's deadline
	}
	t.armed = true
	if t.timer == nil {
		t.timer = time.AfterFunc(t.d, t.fire)
		return
	}
	t.timer.Reset(t.d)
}

// stop stops watching c, whose call has returned, and reports whether its
// timeout fired first and ended one of its leases; it returns only after
// such a timeout has submitted its outcomes.
func (t *timeouts) stop(c *timedCall) (timedOut bool) {
	if t.d == NoHandlerTimeout {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if c.next != nil {
		c.prev.next, c.next.prev = c.next, c.prev
		c.prev, c.next = nil, nil
	}
	for c.firing {
		t.fired.Wait()
	}
	return c.timedOut
}

// fire takes the calls past their deadline off the list, sets the timer
// for the next one's, then times them out and submits their outcomes, and
// lets the stops that wait for them return.
func (t *timeouts) fire() {
	t.mu.Lock()
	t.armed = false
	var due []*timedCall
	now := time.Now()
	for c := t.list.next; c != &t.list; c = t.list.next {
		if c.deadline.After(now) {
			t.armed = true
			t.timer.Reset(c.deadline.Sub(now))
			break
		}
		c.prev.next, c.next.prev = c.next, c.prev
		c.prev, c.next = nil, nil
		c.firing = true
		due = append(due, c)
	}
	t.mu.Unlock()
	if len(due) == 0 {
		return
	}
	// Without t.mu: the writer may take a while to take the outcomes, and
	// meanwhile later calls time out, start and stop.
	var pws []pendingWrite
	for _, c := range due {
		w := t.r.timeOut(c.leases(), c.span, c.cancel)
		c.timedOut = len(w) > 0
		pws = append(pws, w...)
	}
	if len(pws) > 0 {
		t.r.w.submit(pws...)
	}
	t.mu.Lock()
	for _, c := range due {
		c.firing = false
	}
	t.fired.Broadcast()
	t.mu.Unlock()
}

// close stops the timer of a run whose workers have all returned.
func (t *timeouts) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.timer != nil {
		t.timer.Stop()
	}
}

// timeOut ends the attempts of the leases of hs still running past
// HandlerTimeout: their contexts (and the call's, with cancel, nil for
// New) are cancelled with an ErrHandlerTimeout cause, and it returns their
// failures' writes for the caller (timeouts.fire) to submit at once. From
// then on the heartbeat no longer renews them and settle drops what the
// call returns later.
func (r *run) timeOut(hs []*heldLease, span trace.Span, cancel context.CancelCauseFunc) []pendingWrite {
	err := fmt.Errorf("%w after %s", ErrHandlerTimeout, r.p.opts.HandlerTimeout)
	var (
		timedOut []*heldLease
		leases   []leasing.Lease
		pws      []pendingWrite
	)
	for _, h := range hs {
		lease, ok := r.book.timeOut(h)
		if !ok {
			continue
		}
		timedOut = append(timedOut, h)
		leases = append(leases, lease)
		pws = append(pws, r.outcome(h, lease, err))
	}
	if cancel != nil {
		cancel(err)
	}
	for _, h := range timedOut {
		h.cancel(err)
	}
	if len(pws) == 0 {
		return nil
	}
	r.p.ev.handlerTimedOut(span, timedOut, leases)
	return pws
}
