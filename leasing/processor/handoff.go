package processor

import "sync"

// handoff passes started leases from the claim loop to New's workers. A
// worker that returns from a call takes the next queued lease without
// sleeping; an idle worker sleeps until it is woken. At most one woken
// worker is on its way at a time: the one woken, once it has taken a
// lease, wakes the next if leases are still queued. So fast handlers are
// run by the few workers that are awake, one after another, instead of
// one woken worker per lease, while slow ones still get a worker each: a
// worker woken for a lease wakes the next before its handler runs.
type handoff struct {
	mu     sync.Mutex
	queue  []*heldLease    // put, not yet taken, in order
	idle   []chan struct{} // workers asleep, each on its own channel (capacity 1), most recent last
	waking bool            // a worker was woken and has not yet looked
	closed bool            // no more leases come: workers return once the queue is empty
}

// put queues hs and wakes an idle worker unless one is already on its
// way.
func (q *handoff) put(hs ...*heldLease) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.queue = append(q.queue, hs...)
	q.wakeOne()
}

// close lets every worker return once the leases queued are taken.
func (q *handoff) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	for _, w := range q.idle {
		w <- struct{}{}
	}
	q.idle = nil
}

// take returns the next queued lease, sleeping on wake (the caller's own
// channel, capacity 1) while none is queued; false once the handoff is
// closed and empty. A woken worker clears waking when it looks, whether
// or not a lease is left for it (after close, waking no longer matters).
func (q *handoff) take(wake chan struct{}) (*heldLease, bool) {
	q.mu.Lock()
	for {
		if len(q.queue) > 0 {
			h := q.queue[0]
			q.queue[0] = nil
			q.queue = q.queue[1:]
			q.wakeOne()
			q.mu.Unlock()
			return h, true
		}
		if q.closed {
			q.mu.Unlock()
			return nil, false
		}
		q.idle = append(q.idle, wake)
		q.mu.Unlock()
		<-wake
		q.mu.Lock()
		q.waking = false
	}
}

// wakeOne wakes an idle worker when leases are queued and no woken worker
// is on its way. q.mu is held.
func (q *handoff) wakeOne() {
	if q.waking || len(q.queue) == 0 || len(q.idle) == 0 {
		return
	}
	n := len(q.idle) - 1
	w := q.idle[n]
	q.idle[n] = nil
	q.idle = q.idle[:n]
	q.waking = true
	w <- struct{}{}
}
