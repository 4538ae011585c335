package processor

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

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
	// writeCommitted writes nothing: the completion committed with the
	// handler's transaction (NewTx), and is only recorded.
	writeCommitted
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
// while the previous one ran. With Options.MergeCompletions on a
// CompleteClaimer store, while the claim loop drains a backlog, unkeyed
// completions wait in merging for it to send with its next claim (one
// transaction for both); the writer writes them itself once mergeHold has
// passed, once the loop stops draining or once 2 x BatchSize wait. mu
// is its own: it guards takes, queue, merging, mergingSince, spareMerging,
// spareLeases, draining and closed.
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

	// merge is whether unkeyed completions wait for the claim loop;
	// mergeMax is how many may wait before the writer writes them.
	merge    bool
	mergeMax int

	// leases and failures are writeCall's store arguments, reused from one
	// call to the next (a Store does not keep its arguments); only the
	// writer's goroutine touches them.
	leases   []leasing.Lease
	failures []leasing.Failure

	mu           sync.Mutex
	taken        sync.Cond      // on mu: the writer or the loop took outcomes (takes grew)
	takes        uint64         // times the writer or the loop took outcomes
	queue        []pendingWrite // submitted, not yet taken, in submit order, but merging ones
	merging      []pendingWrite // unkeyed completions waiting for the next claim
	mergingSince time.Time      // when the oldest of merging was submitted
	// spareMerging and spareLeases are a merged claim's slices, given back
	// (giveBack) for the next one to reuse: merging and the claim's lease
	// list take turns with them, so that a loop draining a backlog
	// allocates neither per claim. nil while a claim uses them.
	spareMerging []pendingWrite
	spareLeases  []leasing.Lease
	draining     bool // the loop claims again soon: keep holding
	closed       bool
	ready        chan struct{} // capacity 1: queue or closed changed since the writer last looked
	done         chan struct{} // closed when run returns
}

// outcomesWaitingPerSlot is how many outcomes per worker slot may wait for
// the writer (writer.limit) before a worker keeps its slot while its
// outcome waits: enough that workers rarely hold slots through a write,
// few enough that a slow store stops the claims. Measurements:
// docs/notes/2026-12-03-processor-measurements.md.
const outcomesWaitingPerSlot = 8

// mergeHold is the longest an unkeyed completion waits for the claim
// loop's next claim (writer.merging): at most one claim interval of a busy
// processor. Measurements: docs/notes/2026-12-04-processor-speed.md.
const mergeHold = 50 * time.Millisecond

// newWriter returns the writer of p's run over book; limit is how many
// outcomes may wait (see writer.limit). Call run to start it.
func newWriter(p *Processor, book *book, base context.Context, limit int) *writer {
	_, merge := p.store.(CompleteClaimer)
	merge = merge && p.opts.MergeCompletions
	w := &writer{
		p: p, book: book, base: base, limit: limit, merge: merge,
		mergeMax: min(2*p.opts.BatchSize, leasing.MaxBatchSize),
		ready:    make(chan struct{}, 1), done: make(chan struct{}),
	}
	w.taken.L = &w.mu
	return w
}

// submit queues outcomes for the next write, holding unkeyed completions
// for the claim loop when the writer merges. When limit or more were
// already waiting it returns only once the writer or the loop has taken
// some.
func (w *writer) submit(pws ...pendingWrite) {
	w.mu.Lock()
	full := len(w.queue)+len(w.merging) >= w.limit
	for _, pw := range pws {
		if w.merge && pw.kind == writeComplete && pw.failure.Lease.Message.OrderingKey == "" {
			if len(w.merging) == 0 {
				w.mergingSince = time.Now()
			}
			w.merging = append(w.merging, pw)
		} else {
			w.queue = append(w.queue, pw)
		}
	}
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

// resubmit queues outcomes the loop took and could not write, for the
// writer to write (and retry) at once.
func (w *writer) resubmit(pws []pendingWrite) {
	w.mu.Lock()
	w.queue = append(w.queue, pws...)
	w.mu.Unlock()
	w.wake()
}

// takeMerging returns up to leasing.MaxBatchSize merging completions, for the
// claim loop to send with its claim, and their leases in the same order.
// The loop gives both back (giveBack) once the call returned.
func (w *writer) takeMerging() ([]pendingWrite, []leasing.Lease) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := min(len(w.merging), leasing.MaxBatchSize)
	if n == 0 {
		return nil, nil
	}
	var g []pendingWrite
	if n == len(w.merging) {
		g, w.merging, w.spareMerging = w.merging, w.spareMerging[:0], nil
	} else {
		g = append(w.spareMerging[:0], w.merging[:n]...)
		w.merging, w.spareMerging = append(w.merging[:0], w.merging[n:]...), nil
	}
	leases := appendLeases(w.spareLeases[:0], g)
	w.spareLeases = nil
	w.takes++
	w.taken.Broadcast()
	return g, leases
}

// giveBack takes back the slices takeMerging returned, once their call
// returned, for the next merged claim to reuse; their elements are
// cleared first, so that they keep no message alive.
func (w *writer) giveBack(g []pendingWrite, leases []leasing.Lease) {
	clear(g)
	clear(leases)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.spareMerging == nil {
		w.spareMerging = g[:0]
	}
	if w.spareLeases == nil {
		w.spareLeases = leases[:0]
	}
}

// setDraining records whether the claim loop will claim again soon; when
// it will not, the writer writes what it holds. Without merge it does
// nothing.
func (w *writer) setDraining(draining bool) {
	if !w.merge {
		return
	}
	w.mu.Lock()
	changed := w.draining != draining
	w.draining = draining
	w.mu.Unlock()
	if changed && !draining {
		w.wake()
	}
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
	hold := time.NewTimer(mergeHold)
	defer hold.Stop()
	for {
		w.mu.Lock()
		batch, closed := w.queue, w.closed
		w.queue = spare[:0]
		holdFor := time.Duration(0) // how long the merging completions may wait yet
		if len(w.merging) > 0 {
			holdFor = mergeHold - time.Since(w.mergingSince)
			if closed || !w.draining || holdFor <= 0 || len(w.merging) >= w.mergeMax {
				batch = append(batch, w.merging...)
				clear(w.merging)
				w.merging = w.merging[:0]
				holdFor = 0
			}
		}
		if len(batch) > 0 {
			w.takes++
			w.taken.Broadcast()
		}
		w.mu.Unlock()
		switch {
		case len(batch) > 0:
			w.write(batch)
			clear(batch) // drop the leases for the garbage collector
		case closed:
			return
		case holdFor > 0:
			hold.Reset(holdFor)
			select {
			case <-w.ready:
			case <-hold.C:
			}
		default:
			<-w.ready
		}
		spare = batch
	}
}

// write issues one store call per kind of outcome in batch. A batch of
// one kind, the usual one, is written as it is, not copied.
func (w *writer) write(batch []pendingWrite) {
	var groups [writeKinds][]pendingWrite
	if len(batch) > 0 && oneKind(batch) {
		groups[batch[0].kind] = batch
	} else {
		for _, pw := range batch {
			groups[pw.kind] = append(groups[pw.kind], pw)
		}
	}
	// Committed completions need no store call: record them first, not
	// behind the batch's other writes and their retries.
	if g := groups[writeCommitted]; len(g) > 0 {
		w.recordCommitted(g)
		groups[writeCommitted] = nil
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
// so that a key whose row is locked delays the others by one lock timeout only.
func (w *writer) writeGroup(kind writeKind, g []pendingWrite) {
	parts := keyParts(kind, g)
	if len(parts) <= 1 {
		w.writeCall(kind, g, false)
		return
	}
	if w.writeCall(kind, g, true) {
		return
	}
	var blocked [][]pendingWrite // parts whose first try timed out on a key's lock
	for _, part := range parts {
		if !w.writeCall(kind, part, true) {
			blocked = append(blocked, part)
		}
	}
	for _, part := range blocked {
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
		leases = appendLeases(w.leases[:0], g)
		w.leases = leases
		defer clear(leases) // drop the leases for the garbage collector
	} else {
		failures = w.failures[:0]
		for _, pw := range g {
			failures = append(failures, pw.failure)
		}
		w.failures = failures
		defer clear(failures)
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
		p.ev.writeAbandoned(span, "split by ordering key", err)
		return false
	}
	w.recorded(span, kind, g, res, err)
	return true
}

// recordCommitted records g, completions that committed with their
// handler's transactions, as applied: there is nothing left to write.
func (w *writer) recordCommitted(g []pendingWrite) {
	res := leasing.WriteResult{Outcomes: make([]leasing.MessageOutcome, len(g))}
	for i, pw := range g {
		res.Outcomes[i] = leasing.MessageOutcome{MessageID: pw.failure.Lease.Message.ID, Outcome: leasing.OutcomeApplied}
	}
	w.recorded(nil, writeCommitted, g, res, nil)
}

// recorded records the write of g, outcomes of kind, that reported res or
// was given up with err (in span): the leases are no longer held, the
// outcomes are counted and logged, a refused privilege stops the
// processor, and dueSoon hears of retries and freed keys.
func (w *writer) recorded(span trace.Span, kind writeKind, g []pendingWrite, res leasing.WriteResult, err error) {
	p := w.p
	p.noteWrite() // also after an error: the write may have committed
	w.book.untrack(g, err != nil)
	p.ev.written(span, kind, g, res, err)
	switch {
	case errors.Is(err, leasing.ErrPermissionDenied):
		p.refuse(p.ev.errorf("stopped: the database refused an outcome write", err))
	case err == nil && (kind == writeFail || kind == writeReleaseAfter):
		w.retriesDue(g, res)
	case err == nil && (kind == writeComplete || kind == writeCommitted || kind == writeDeadLetter):
		w.keysFreed(g, res)
	}
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

// appendLeases appends the leases of g's outcomes to dst, in g's order.
func appendLeases(dst []leasing.Lease, g []pendingWrite) []leasing.Lease {
	for _, pw := range g {
		dst = append(dst, pw.failure.Lease)
	}
	return dst
}

// oneKind reports whether every outcome in batch is of one kind.
func oneKind(batch []pendingWrite) bool {
	for _, pw := range batch {
		if pw.kind != batch[0].kind {
			return false
		}
	}
	return true
}

// keyParts splits g into the outcomes of each ordering key (tenant and key,
// in order of first appearance) and one part of the unkeyed ones, for
// completions and dead letters; it returns nil for other kinds, and g
// itself as the one part when no outcome in it is keyed.
func keyParts(kind writeKind, g []pendingWrite) [][]pendingWrite {
	if kind != writeComplete && kind != writeDeadLetter {
		return nil
	}
	if !slices.ContainsFunc(g, func(pw pendingWrite) bool { return pw.failure.Lease.Message.OrderingKey != "" }) {
		return [][]pendingWrite{g}
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
