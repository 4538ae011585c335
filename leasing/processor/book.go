package processor

import (
	"context"
	"sync"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/leasestore/leasestore/leasing"
)

// leaseState is where a held lease is in its lifecycle.
type leaseState int

const (
	stateWaiting leaseState = iota // claimed, waiting for a worker slot
	stateRunning                   // its handler runs
	stateWriting                   // its outcome (or release) is being written
)

// heldLease is one lease a processor holds. Its lease, deadline, state,
// lost, timedOut and committing fields belong to the book that tracks it:
// only book methods read or write them, under book.mu; but for two reads of
// lease.Message without it, of leases whose outcome no one writes yet (the
// loop's releaseOpen, of waiting leases, and the batch span's message ids,
// as the call starts), which renews do not change. ctx and cancel are set
// once, by track. The heldLeases of one claim share one allocation, as
// their leases do.
type heldLease struct {
	// lease is its element of the lease list of the claim that took it,
	// which the claim's other leases share: not copied, it costs no
	// allocation per lease. untrack zeroes it once the outcome is written,
	// so that a lease of the claim still held does not keep the written
	// ones' messages alive. A lease lost is not zeroed: its message stays
	// until the claim's other leases are let go too.
	lease    *leasing.Lease
	deadline time.Time // local: the lease may have expired from then on
	state    leaseState
	lost     bool
	timedOut bool // its handler ran past HandlerTimeout: the timeout's outcome is written, not the handler's
	// committing: its NewTx handler's transaction, which holds the
	// message's completion, is committing; the commit is the outcome's
	// write (see book.committing).
	committing bool
	ctx        context.Context
	cancel     context.CancelCauseFunc
	// span is the process span of its handler's attempt, nil without
	// tracing or before the handler starts; set by the worker before the
	// timeout starts, ended by the outcome's write or by a lost lease.
	span trace.Span
	// call is New's handler call over this lease, for the run's timeouts.
	call timedCall
}

// book is the set of leases one Run holds, from claim until the outcome is
// written or the lease is lost, and of the leases it gave up recently. The
// claim loop, the workers, the heartbeat and the writer change it through
// its methods; mu is its own.
type book struct {
	leaseFor time.Duration
	ev       *events

	mu sync.Mutex
	// held maps each message id to the live lease held on it.
	held map[uuid.UUID]*heldLease
	// lostAt holds when each lease lost in the last leaseFor was given up:
	// an orphan sweep must not release those rows, whose attempt ran.
	lostAt map[uuid.UUID]time.Time
}

func newBook(leaseFor time.Duration, ev *events) *book {
	return &book{leaseFor: leaseFor, ev: ev, held: make(map[uuid.UUID]*heldLease), lostAt: make(map[uuid.UUID]time.Time)}
}

// track starts holding leases claimed with a call sent at sent; their
// handler contexts carry base's values. The book keeps leases, whose
// elements it changes: the caller must not use it again. A lease still
// held on one of these messages under an older generation has evidently
// expired and been reclaimed: it is lost.
func (b *book) track(base context.Context, leases []leasing.Lease, sent time.Time) []*heldLease {
	b.mu.Lock()
	defer b.mu.Unlock()
	hs := make([]heldLease, len(leases)) // one allocation per claim, as for leases
	out := make([]*heldLease, len(leases))
	for i := range leases {
		l := &leases[i]
		if old := b.held[l.Message.ID]; old != nil && !old.writing() {
			b.markLost(old)
		}
		ctx, cancel := context.WithCancelCause(base)
		h := &hs[i]
		*h = heldLease{lease: l, deadline: sent.Add(b.leaseFor), ctx: ctx, cancel: cancel}
		b.held[l.Message.ID] = h
		out[i] = h
	}
	return out
}

// known returns the ids of the messages held and of those given up in the
// last leaseFor: the rows an orphan sweep must leave alone.
func (b *book) known() []uuid.UUID {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pruneLost()
	ids := make([]uuid.UUID, 0, len(b.held)+len(b.lostAt))
	for id := range b.held {
		ids = append(ids, id)
	}
	for id := range b.lostAt {
		ids = append(ids, id)
	}
	return ids
}

// advance moves h on to state (stateRunning or stateWriting) and returns
// its lease, or reports false when h was lost meanwhile (counted
// persist_skipped): lost while it waited, or while its handler ran; or
// when its handler timed out, whose outcome timeOut took. A lease whose
// local deadline has passed does not start running: it is lost then, as
// its row may have been claimed again (a claim answered late, or renews
// failed while it waited).
func (b *book) advance(h *heldLease, state leaseState) (leasing.Lease, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if h.timedOut {
		return leasing.Lease{}, false
	}
	if state == stateRunning {
		b.loseIfPast(h, time.Now())
	}
	if h.lost {
		b.ev.skipped()
		return leasing.Lease{}, false
	}
	h.state = state
	return *h.lease, true
}

// lease returns h's lease as it stands: the renews so far set its
// ExpiresAt.
func (b *book) lease(h *heldLease) leasing.Lease {
	b.mu.Lock()
	defer b.mu.Unlock()
	return *h.lease
}

// committing marks h, whose NewTx handler has completed its message in
// the handler's transaction, as committing, before that transaction
// commits: the commit is the outcome's write, and a renew blocked on the
// row's lock, which the commit answers lost, must not give the lease up;
// the commit's result decides, as a write's does (writing). h stays
// running: HandlerTimeout, the end of ShutdownGrace and the lease's local
// deadline still cancel its context, which interrupts a commit that
// stalls. It returns leasing.ErrLeaseLost or ErrHandlerTimeout, and
// changes nothing, when h was lost or timed out meanwhile: the
// transaction must then roll back.
func (b *book) committing(h *heldLease) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case h.lost:
		return leasing.ErrLeaseLost
	case h.timedOut:
		return ErrHandlerTimeout
	}
	h.committing = true
	return nil
}

// writing reports whether h's outcome is being written, by the writer or
// by its NewTx handler's commit: a renew or a claim that finds the lease
// gone leaves it to the write's result. The caller holds b.mu.
func (h *heldLease) writing() bool {
	return h.state == stateWriting || h.committing
}

// isLost reports whether h was lost.
func (b *book) isLost(h *heldLease) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return h.lost
}

// timeOut moves h, whose handler ran past HandlerTimeout, on to
// stateWriting for the timeout's outcome and returns its lease, or reports
// false when the handler returned first or the lease was lost. Once it
// returns true, advance refuses h: the handler's own outcome is never
// written.
func (b *book) timeOut(h *heldLease) (leasing.Lease, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if h.lost || h.state != stateRunning {
		return leasing.Lease{}, false
	}
	h.state = stateWriting
	h.timedOut = true
	return *h.lease, true
}

// stopWaiting cancels the leases of waiting, whose handlers have not
// started, with cause (ErrShutdown, errBreakerOpen), and returns their
// releases. Those lost meanwhile are counted persist_skipped instead.
func (b *book) stopWaiting(waiting []*heldLease, cause error) []pendingWrite {
	b.mu.Lock()
	defer b.mu.Unlock()
	var release []pendingWrite
	for _, h := range waiting {
		if h.lost {
			b.ev.skipped()
			continue
		}
		h.state = stateWriting
		h.cancel(cause)
		release = append(release, pendingWrite{h: h, kind: writeRelease, failure: leasing.Failure{Lease: *h.lease}})
	}
	return release
}

// cancelRunning cancels the context of every lease whose handler runs,
// with cause.
func (b *book) cancelRunning(cause error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, h := range b.held {
		if h.state == stateRunning {
			h.cancel(cause)
		}
	}
}

// untrack stops holding the leases of g once their outcomes are written or
// given up, and zeroes their leases (heldLease.lease); the writes carry
// copies. gaveUp says the write was given up, so that orphan sweeps leave
// those rows alone: their handlers ran.
func (b *book) untrack(g []pendingWrite, gaveUp bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, pw := range g {
		id := pw.h.lease.Message.ID
		if b.held[id] == pw.h {
			delete(b.held, id)
		}
		if gaveUp {
			b.rememberLost(id)
		}
		*pw.h.lease = leasing.Lease{}
	}
}

// markLost gives up h: its handler is cancelled and it is no longer
// renewed. The caller holds b.mu and has checked h.state != stateWriting.
func (b *book) markLost(h *heldLease) {
	if h.lost {
		return
	}
	h.lost = true
	h.cancel(leasing.ErrLeaseLost)
	b.rememberLost(h.lease.Message.ID)
	if b.held[h.lease.Message.ID] == h {
		delete(b.held, h.lease.Message.ID)
	}
	b.ev.leaseLost(h)
}

// rememberLost records that the lease on id was given up, so that orphan
// sweeps leave its row alone for one leaseFor. The caller holds b.mu.
func (b *book) rememberLost(id uuid.UUID) {
	b.lostAt[id] = time.Now()
	if len(b.lostAt) > 1024 {
		b.pruneLost()
	}
}

// pruneLost forgets leases given up more than leaseFor ago: they have
// expired, and the rows may be reclaimed by anyone; a sweep leaves expired
// leases alone (Store.ReleaseOrphans), so that one still unreclaimed keeps
// the attempt its handler ran. The caller holds b.mu.
func (b *book) pruneLost() {
	for id, at := range b.lostAt {
		if time.Since(at) > b.leaseFor {
			delete(b.lostAt, id)
		}
	}
}

// renewable returns the leases to renew at now and the soonest local
// deadline among them. Leases past their local deadline are lost without
// asking the store.
func (b *book) renewable(now time.Time) (leases []leasing.Lease, deadline time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, h := range b.held {
		if b.loseIfPast(h, now) {
			continue
		}
		leases = append(leases, *h.lease)
		if deadline.IsZero() || h.deadline.Before(deadline) {
			deadline = h.deadline
		}
	}
	return leases, deadline
}

// loseIfPast reports whether h's local deadline has passed at now, and
// then gives h up unless its outcome is being written by the writer: the
// write's result decides. A commit still running past the deadline is
// given up too: cancelling its context interrupts it. The caller holds
// b.mu.
func (b *book) loseIfPast(h *heldLease, now time.Time) bool {
	if h.deadline.After(now) {
		return false
	}
	if h.state != stateWriting {
		b.markLost(h)
	}
	return true
}

// applyRenew records a Renew result for batch, sent at sent, and returns
// how many of res.Lost it gave up as lost. The others were no longer
// renewable because this processor's own outcome write had finished them
// or was under way (that write's result decides).
func (b *book) applyRenew(batch []leasing.Lease, res leasing.RenewResult, sent time.Time) (lost int) {
	generation := make(map[uuid.UUID]int64, len(batch))
	for _, l := range batch {
		generation[l.Message.ID] = l.Generation
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, l := range res.Renewed {
		if h := b.held[l.Message.ID]; h != nil && h.lease.Generation == l.Generation {
			h.lease.ExpiresAt = l.ExpiresAt
			h.deadline = sent.Add(b.leaseFor)
		}
	}
	for _, id := range res.Lost {
		// A lease whose outcome is being written may have been finished
		// by that write before this renew ran: the write's result decides.
		if h := b.held[id]; h != nil && h.lease.Generation == generation[id] && !h.writing() {
			b.markLost(h)
			lost++
		}
	}
	return lost
}

// heartbeat renews the leases of a book every HeartbeatInterval.
type heartbeat struct {
	p    *Processor
	book *book
}

// run renews until ctx ends.
func (hb heartbeat) run(ctx context.Context) {
	t := time.NewTicker(hb.p.opts.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			hb.renew(ctx)
		}
	}
}

// renew renews every held lease with one Renew call (one per
// leasing.MaxBatchSize leases) whose deadline is the soonest local lease
// deadline.
func (hb heartbeat) renew(ctx context.Context) {
	p := hb.p
	leases, deadline := hb.book.renewable(time.Now())
	if len(leases) == 0 {
		return
	}
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	for len(leases) > 0 {
		batch := leases[:min(len(leases), leasing.MaxBatchSize)]
		leases = leases[len(batch):]
		sent := time.Now()
		sctx, span := p.ev.renewStarted(rctx, len(batch))
		res, err := p.store.Renew(sctx, p.opts.LeaseDuration, batch...)
		p.noteWrite() // a renew leaves dead row versions too
		lost := 0
		if err == nil {
			lost = hb.book.applyRenew(batch, res, sent)
		}
		p.ev.renewed(span, len(batch), res, lost, err, ctx.Err() != nil)
	}
}
