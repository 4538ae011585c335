package processor

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/leasestore/leasestore/leasing"
)

// Outcome writes that fail with a driver error are tried this many times in
// all, waiting writeBackoff, then twice that, and so on, in between.
const (
	writeTries   = 5
	writeBackoff = 50 * time.Millisecond
)

// writeKind is the store call a pendingWrite needs.
type writeKind int

const (
	writeRelease writeKind = iota
	writeComplete
	writeFail
	writeDeadLetter
	// writeReleaseAfter releases with a delay and an error, the attempt
	// returned: a RetryAfter or Unavailable verdict.
	writeReleaseAfter
	writeKinds // the number of kinds
)

// storeWrite is one store call writing outcomes.
type storeWrite func(context.Context) (leasing.WriteResult, error)

// pendingWrite is one outcome waiting for the writer.
type pendingWrite struct {
	h       *heldLease
	kind    writeKind
	failure leasing.Failure // Lease always; RetryAfter and Error for fail, dead letter and release after
	verdict Verdict         // the handler's verdict on its error, for the logs
}

// writer writes outcomes in batches: each write takes everything queued
// while the previous one ran. mu is its own: it guards takes, queue and
// closed.
type writer struct {
	p    *Processor
	book *book
	base context.Context
	// dueSoon is called with d when a message may become due within d: a
	// failure's retry delay, or 0 when a keyed outcome may have promoted
	// the next message of its key (which no work signal announces).
	dueSoon func(time.Duration)
	// limit is how many outcomes may wait before a submitting worker keeps
	// its slot until the writer has taken them.
	limit int

	mu     sync.Mutex
	taken  sync.Cond      // on mu: the writer took the queue (takes grew)
	takes  uint64         // times the writer took the queue
	queue  []pendingWrite // submitted, not yet taken, in submit order
	closed bool
	ready  chan struct{} // capacity 1: queue or closed changed since the writer last looked
	done   chan struct{} // closed when run returns
}

// outcomesWaitingPerSlot is how many outcomes per worker slot may wait for
// the writer (writer.limit) before a worker keeps its slot while its
// outcome waits: enough that workers rarely hold slots through a write,
// few enough that a slow store stops the claims. Measurements:
// docs/notes/2026-12-03-processor-measurements.md.
const outcomesWaitingPerSlot = 8

// newWriter returns the writer of p's run over book; limit is how many
// outcomes may wait (see writer.limit). Call run to start it.
func newWriter(p *Processor, book *book, base context.Context, limit int) *writer {
	w := &writer{p: p, book: book, base: base, limit: limit, ready: make(chan struct{}, 1), done: make(chan struct{})}
	w.taken.L = &w.mu
	return w
}

// submit queues outcomes for the next write. When limit or more were
// already waiting it returns only once the writer has taken them.
func (w *writer) submit(pws ...pendingWrite) {
	w.mu.Lock()
	full := len(w.queue) >= w.limit
	w.queue = append(w.queue, pws...)
	takes := w.takes
	w.mu.Unlock()
	w.wake()
	if !full {
		return
	}
	w.mu.Lock()
	for w.takes == takes {
		w.taken.Wait()
	}
	w.mu.Unlock()
}

func (w *writer) wake() {
	select {
	case w.ready <- struct{}{}:
	default:
	}
}

// close stops the writer after it wrote everything submitted.
func (w *writer) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.wake()
	<-w.done
}

// run writes what is queued until close. Two buffers take turns as the
// queue, so that a busy writer does not allocate one per write.
func (w *writer) run() {
	defer close(w.done)
	var spare []pendingWrite
	for {
		w.mu.Lock()
		batch, closed := w.queue, w.closed
		w.queue = spare[:0]
		if len(batch) > 0 {
			w.takes++
			w.taken.Broadcast()
		}
		w.mu.Unlock()
		if len(batch) > 0 {
			w.write(batch)
			clear(batch) // drop the leases for the garbage collector
		} else if closed {
			return
		} else {
			<-w.ready
		}
		spare = batch
	}
}

// write issues one store call per kind of outcome in batch.
func (w *writer) write(batch []pendingWrite) {
	var groups [writeKinds][]pendingWrite
	for _, pw := range batch {
		groups[pw.kind] = append(groups[pw.kind], pw)
	}
	for kind, g := range groups {
		for len(g) > 0 {
			part := g[:min(len(g), leasing.MaxBatchSize)]
			g = g[len(part):]
			w.writeGroup(writeKind(kind), part)
		}
	}
}

// writeGroup writes g, outcomes of one kind, with one store call. A
// completion or dead letter of keyed heads locks their key rows, which an
// open enqueue transaction may hold: when such a call over several keys
// times out on a lock, nothing was written and g is written again one call
// per key (and one for the unkeyed), each tried once before any is retried,
// so that a held key delays the others by one lock timeout only.
func (w *writer) writeGroup(kind writeKind, g []pendingWrite) {
	parts := keyParts(kind, g)
	if len(parts) <= 1 {
		w.writeCall(kind, g, false)
		return
	}
	if w.writeCall(kind, g, true) {
		return
	}
	var held [][]pendingWrite
	for _, part := range parts {
		if !w.writeCall(kind, part, true) {
			held = append(held, part)
		}
	}
	for _, part := range held {
		w.writeCall(kind, part, false)
	}
}

// writeCall writes g, outcomes of one kind, with one store call (see
// persist). With yield, a first try that fails with leasing.ErrLockTimeout
// writes nothing and returns false, for the caller to write g again.
func (w *writer) writeCall(kind writeKind, g []pendingWrite, yield bool) bool {
	p := w.p
	var (
		leases   []leasing.Lease   // release and complete
		failures []leasing.Failure // fail, dead letter and release after
	)
	if kind == writeRelease || kind == writeComplete {
		leases = make([]leasing.Lease, len(g))
		for i, pw := range g {
			leases[i] = pw.failure.Lease
		}
	} else {
		failures = make([]leasing.Failure, len(g))
		for i, pw := range g {
			failures[i] = pw.failure
		}
	}
	call := storeWrite(func(ctx context.Context) (leasing.WriteResult, error) {
		switch kind {
		case writeRelease:
			return p.store.Release(ctx, leases...)
		case writeComplete:
			return p.store.Complete(ctx, leases...)
		case writeFail:
			return p.store.Fail(ctx, failures...)
		case writeReleaseAfter:
			return p.store.ReleaseAfter(ctx, failures...)
		default:
			return p.store.DeadLetter(ctx, failures...)
		}
	})
	span, call := p.ev.writeStarted(kind, g, call)
	res, err := w.persist(call, yield)
	if yield && errors.Is(err, leasing.ErrLockTimeout) {
		p.ev.writeSplit(span, err)
		return false
	}
	p.noteWrite() // also after an error: the write may have committed
	w.book.untrack(g, err != nil)
	p.ev.written(span, kind, g, res, err)
	switch {
	case errors.Is(err, leasing.ErrPermissionDenied):
		p.refuse(p.ev.errorf("stopped: the database refused an outcome write", err))
	case err == nil && (kind == writeFail || kind == writeReleaseAfter):
		w.retriesDue(g, res)
	case err == nil && (kind == writeComplete || kind == writeDeadLetter):
		w.keysFreed(g, res)
	}
	return true
}

// retriesDue calls dueSoon with the retry delay of each failure of g that
// res reports applied.
func (w *writer) retriesDue(g []pendingWrite, res leasing.WriteResult) {
	for i, o := range res.Outcomes {
		if o.Outcome == leasing.OutcomeApplied && i < len(g) && w.dueSoon != nil {
			w.dueSoon(g[i].failure.RetryAfter)
		}
	}
}

// keysFreed calls dueSoon(0), once per call, when res recorded an outcome
// of a keyed lease of g: the store may have promoted the next message of
// its key, and with a WorkSignal the next poll may be far.
func (w *writer) keysFreed(g []pendingWrite, res leasing.WriteResult) {
	if w.dueSoon == nil {
		return
	}
	for i, o := range res.Outcomes {
		if o.Outcome.Succeeded() && i < len(g) && g[i].failure.Lease.Message.OrderingKey != "" {
			w.dueSoon(0)
			return
		}
	}
}

// persist calls call until it succeeds, fails for good (an invalid
// argument, a refused privilege) or writeTries calls failed; each call may
// take LeaseDuration. With yield, a first ErrLockTimeout returns at once.
func (w *writer) persist(call storeWrite, yield bool) (leasing.WriteResult, error) {
	p := w.p
	backoff := writeBackoff
	for try := 1; ; try++ {
		ctx, cancel := context.WithTimeout(w.base, p.opts.LeaseDuration)
		res, err := call(ctx)
		cancel()
		if err == nil || errors.Is(err, leasing.ErrInvalidArgument) || errors.Is(err, leasing.ErrPermissionDenied) || try == writeTries ||
			yield && try == 1 && errors.Is(err, leasing.ErrLockTimeout) {
			return res, err
		}
		p.ev.writeTryFailed(try, err)
		time.Sleep(backoff)
		backoff *= 2
	}
}

// keyParts splits g into the outcomes of each ordering key (tenant and key,
// in order of first appearance) and one part of the unkeyed ones, for
// completions and dead letters; it returns nil for other kinds.
func keyParts(kind writeKind, g []pendingWrite) [][]pendingWrite {
	if kind != writeComplete && kind != writeDeadLetter {
		return nil
	}
	type key struct{ tenant, key string }
	index := map[key]int{}
	var parts [][]pendingWrite
	for _, pw := range g {
		m := pw.failure.Lease.Message
		k := key{m.TenantID, m.OrderingKey}
		if m.OrderingKey == "" {
			k = key{} // every unkeyed outcome in one part
		}
		i, ok := index[k]
		if !ok {
			i = len(parts)
			index[k] = i
			parts = append(parts, nil)
		}
		parts[i] = append(parts[i], pw)
	}
	return parts
}
