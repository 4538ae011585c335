package processor

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leasestore/leasestore/leasing"
)

// run is the state of one Run call: the claim loop, which claims batches
// and dispatches their leases to workers. Only the loop goroutine touches
// waiting, running, workers, sched, claiming, claimsSent, wakes,
// sweepUntil, allowed and openings; the leases are in the book.
type run struct {
	p        *Processor
	base     context.Context // Run's values, never cancelled
	book     *book
	w        *writer
	waiting  []*heldLease   // claimed, in claim order, not started
	running  int            // handler calls started and not yet taken from finished
	finished atomic.Int64   // handler calls finished since the loop last looked
	freed    chan struct{}  // capacity 1: some handler call finished since the loop last looked
	wg       sync.WaitGroup // worker goroutines
	timeouts *timeouts      // the workers' handler calls under HandlerTimeout

	// New's workers are goroutines that outlive their handler calls: the
	// loop puts each started lease in started, and starts another worker
	// only when more calls run than there are workers (so at most
	// Concurrency). A worker reused keeps its grown stack, where a
	// goroutine per call grew a new one each time; one back from a call
	// takes the next lease without sleeping (see handoff). NewBatch starts
	// a goroutine per call instead.
	started *handoff // New: the leases started, to the workers; closed by shutdown
	workers int      // New: worker goroutines started

	// Claims run on goroutines of their own, so that the loop goes on
	// starting waiting leases as slots free meanwhile; at most
	// maxClaimsInFlight at once (see claimWanted).
	claiming   int              // claims in flight; their results come on claimed
	claimed    chan claimResult // capacity maxClaimsInFlight
	claimsSent int64            // claims started so far, with those that failed before sending: the newest one's claimResult.seq
	wakes      int64            // WorkSignal wakes so far

	sched      schedule  // when to claim: the next poll and the early-claim deadlines
	openings   int64     // breaker openings the loop has released the waiting leases for
	sweepUntil time.Time // after a failed claim: sweep orphans before each claim until then
	allowed    bool      // the PrivilegeChecker found nothing missing; until then it replaces each claim

	earlyClaim   chan struct{} // capacity 1: claimEarly added to earlyClaimAt
	earlyClaimMu sync.Mutex    // guards earlyClaimAt
	earlyClaimAt []time.Time   // claimEarly deadlines since the loop last looked
}

func newRun(p *Processor, base context.Context, book *book, w *writer) *run {
	r := &run{
		p: p, base: base, book: book, w: w,
		freed: make(chan struct{}, 1), claimed: make(chan claimResult, maxClaimsInFlight), earlyClaim: make(chan struct{}, 1),
	}
	if p.batch == nil {
		r.started = &handoff{}
	}
	r.timeouts = newTimeouts(r, p.opts.HandlerTimeout)
	return r
}

// claimEarly tells the loop that a message may be due within d (on the
// store's clock; a hint), so that it claims then, whatever else happens
// before: the loop keeps the deadline in its schedule until a claim starts
// at or after it.
func (r *run) claimEarly(d time.Duration) {
	at := time.Now().Add(max(d, 0))
	r.earlyClaimMu.Lock()
	r.earlyClaimAt = append(r.earlyClaimAt, at)
	r.earlyClaimMu.Unlock()
	select {
	case r.earlyClaim <- struct{}{}:
	default:
	}
}

// loop claims and dispatches until shutdown is requested. It returns once
// no claim is in flight, the leases of the last ones waiting.
func (r *run) loop(ctx context.Context) {
	p := r.p
	var wake <-chan struct{}
	if p.opts.WorkSignal != nil {
		wake = p.opts.WorkSignal.Wake()
	}
	poll := time.NewTimer(p.opts.PollInterval)
	defer poll.Stop()
	defer r.awaitClaims()
	due := true   // whether due messages may be waiting: claim when a slot frees
	full := false // the last claim to return took a full batch: a backlog drains
	var idle pollBackoff
	// claimEnded records a claim's result: the leases to dispatch, whether
	// more may be due, and the next poll. More may be due after a full
	// batch, or after a wake that came once the claim was sent; else the
	// newest claim sent decides, not an older one that returns after it.
	claimEnded := func(res claimResult) {
		r.waiting = append(r.waiting, r.releaseOpened(res)...)
		switch {
		case res.full || r.wakes != res.wakes:
			due = true
		case res.seq == r.claimsSent:
			due = false
		}
		full = res.full
		if res.sweep {
			// The claim may have committed before its reply was lost:
			// sweep for one lease duration from now, when such leases
			// have expired.
			r.sweepUntil = time.Now().Add(p.opts.LeaseDuration)
		}
		r.w.setDraining(due)
		wait := p.opts.PollInterval
		switch {
		case res.found < 0: // failed: wait PollInterval, then back off anew
			idle = pollBackoff{}
		case wake != nil:
			wait = idle.next(res.found > 0, p.opts.PollInterval)
		}
		r.sched.claimed(res.sent, time.Now().Add(wait))
		poll.Reset(time.Until(r.sched.next()))
	}
	for {
		r.releaseOpenWaiting()
		r.dispatch()
		if ctx.Err() != nil {
			p.requestStop()
		}
		select {
		case <-p.stop:
			return
		default:
		}
		if due && r.claimWanted(full) {
			if res, started := r.startClaim(); !started {
				claimEnded(res)
			}
			continue
		}
		select {
		case <-ctx.Done():
			p.requestStop()
			return
		case <-p.stop:
			return
		case res := <-r.claimed:
			r.claiming--
			claimEnded(res)
		case <-poll.C:
			due = true
		case _, ok := <-wake:
			if !ok {
				wake = nil // a closed signal must not spin the loop
			}
			due = true
			r.wakes++
		case <-r.freed:
			r.running -= int(r.finished.Swap(0))
		case <-r.earlyClaim:
			r.earlyClaimMu.Lock()
			for _, at := range r.earlyClaimAt {
				r.sched.addDeadline(at)
			}
			r.earlyClaimAt = r.earlyClaimAt[:0]
			r.earlyClaimMu.Unlock()
			poll.Reset(time.Until(r.sched.next()))
		}
	}
}

// awaitClaims waits for the claims in flight and queues their leases.
func (r *run) awaitClaims() {
	for ; r.claiming > 0; r.claiming-- {
		r.waiting = append(r.waiting, (<-r.claimed).held...)
	}
}

// maxClaimsInFlight is how many claims a processor has in flight at most:
// a second one goes while a backlog drains faster than one claim at a time
// feeds the workers, for batches of at most pipelinedBatchMax.
const maxClaimsInFlight = 2

// pipelinedBatchMax is the largest BatchSize for which a second claim
// goes while one is in flight. A small claim's time is mostly its round
// trip and commit, which a second claim overlaps; a large one's is mostly
// its rows, and a second claim beside it skips the first's locked rows.
// With no-op handlers, a second claim made a processor claiming batches
// of 100 drain up to 15% faster, of 200 as fast, of 500 and 1,000 about
// 10% slower (docs/notes/2026-12-04-claims-in-flight.md).
const pipelinedBatchMax = 100

// claimWanted reports whether the loop claims now, backlog permitting
// (full: the last claim to return took a full batch).
//
// With no claim in flight: when a slot is free and no lease waits for one,
// or (New) when fewer leases wait than claimAhead, so that the workers
// have leases to start while the claim commits. With one in flight (New,
// full, BatchSize at most pipelinedBatchMax): when a slot is free and no
// lease waits for one, so that workers that finish faster than a claim
// returns are fed by two claims in turn; not while orphans are swept,
// which must see no claim in flight.
//
// A New processor so has at most Concurrency - 1 + max(claimAhead +
// BatchSize, 2 x BatchSize) leases waiting or running; a NewBatch one
// claims only with a slot free and none in flight, so that a call's
// leases are one claim's.
func (r *run) claimWanted(full bool) bool {
	opts := r.p.opts
	starved := len(r.waiting) == 0 && r.running < opts.Concurrency
	switch {
	case r.claiming == 0:
		return starved || (r.p.batch == nil && len(r.waiting) < r.claimAhead())
	case r.claiming < maxClaimsInFlight:
		return r.p.batch == nil && opts.BatchSize <= pipelinedBatchMax && full && starved &&
			!time.Now().Before(r.sweepUntil)
	default:
		return false
	}
}

// claimAhead is how few waiting leases make the loop claim with every slot
// busy: half the smaller of BatchSize and Concurrency, so none when either
// is 1 (the loop then claims only once a slot is free).
func (r *run) claimAhead() int {
	return min(r.p.opts.BatchSize, r.p.opts.Concurrency) / 2
}

// Poll backoff with a WorkSignal: the insert trigger notifies at most about
// 100 times a second per table, so a row may commit without a notification
// of its own. After a claim that found work the loop claims again
// signalRepoll later, doubling the wait while claims find nothing up to
// signalRepollMax, then waits PollInterval.
const (
	signalRepoll    = 2 * time.Millisecond
	signalRepollMax = 64 * time.Millisecond
)

// pollBackoff is the wait before the next poll with a WorkSignal.
type pollBackoff struct {
	wait time.Duration // last short wait; 0 once at the ceiling
}

// next returns the wait after a claim that found work (found) or found
// none, at most ceiling.
func (b *pollBackoff) next(found bool, ceiling time.Duration) time.Duration {
	switch {
	case found:
		b.wait = signalRepoll
	case b.wait > 0 && b.wait < signalRepollMax:
		b.wait *= 2
	default:
		b.wait = 0
		return ceiling
	}
	return min(b.wait, ceiling)
}

// claimResult is what one claim took, and what the loop knew when it was
// sent.
type claimResult struct {
	seq      int64        // the claim's number: run.claimsSent when it was sent
	sent     time.Time    // when it was sent
	wakes    int64        // run.wakes when it was sent
	openings int64        // the breaker's openings when it was sent
	held     []*heldLease // the leases it took, in claim order: the claim's, then the probes'
	claimed  int          // how many of held the claim took, the rest are probes'
	full     bool         // the claim took a full batch
	found    int          // messages taken, leased or parked; -1 when it failed
	sweep    bool         // a claim failed after it was sent: it may have committed leases
}

// startClaim starts one claim on a goroutine of its own, which sends its
// result on r.claimed: a claim of the topics whose breaker is closed, and
// a probe of one message per open topic due for one (see breaker). When
// the privilege check or the orphan sweep that must come first fails, it
// starts nothing and returns the failed result instead. Run on the loop;
// a sweep runs only with no claim in flight (claimWanted).
func (r *run) startClaim() (failed claimResult, started bool) {
	p := r.p
	r.claimsSent++
	res := claimResult{seq: r.claimsSent, sent: time.Now(), wakes: r.wakes, found: -1}
	if !r.allowed && !r.checkPrivileges() {
		return res, false
	}
	if time.Now().Before(r.sweepUntil) && !r.sweepOrphans() {
		return res, false
	}
	res.openings, res.found = p.breaker.openings(), 0
	plan := p.breaker.plan(time.Now())
	if !plan.nextProbe.IsZero() {
		r.sched.addDeadline(plan.nextProbe)
	}
	claim, probes := plan.requests(p.claimRequest)
	r.claiming++
	go func() {
		if claim != nil && r.claimOnce(*claim, true, &res) {
			res.full = res.found >= claim.BatchSize
		}
		res.claimed = len(res.held)
		for _, probe := range probes { // one message each
			if res.found < 0 || !r.claimOnce(probe, false, &res) {
				break
			}
		}
		r.claimed <- res
	}()
	return claimResult{}, true
}

// claimOnce sends one claim of req and adds its leases and the messages
// it took (leased or parked) to res; with merge, the completions the
// writer holds go with it. When it fails it marks res failed (found -1,
// not full, sweep) and reports false.
func (r *run) claimOnce(req leasing.ClaimRequest, merge bool, res *claimResult) bool {
	p := r.p
	ctx, cancel := context.WithTimeout(r.base, p.opts.LeaseDuration)
	defer cancel()
	sent := time.Now()
	var (
		done       []pendingWrite  // completions sent with the claim
		doneLeases []leasing.Lease // their leases
		leases     []leasing.Lease // the claim's
		err        error
	)
	if merge && r.w.merge {
		done, doneLeases = r.w.takeMerging()
	}
	if len(done) > 0 {
		leases, err = r.completeAndClaim(ctx, done, doneLeases, req)
		r.w.giveBack(done, doneLeases)
	} else {
		leases, err = p.store.Claim(ctx, req)
	}
	pe := (*leasing.ParkedError)(nil)
	if errors.As(err, &pe) {
		err = nil // the claim dead-lettered rows it could not lease; its leases are good
	}
	base := p.ev.claimed(r.base, sent, leases, pe, err)
	if err != nil {
		res.found, res.full, res.sweep = -1, false, true
		return false
	}
	found := len(leases)
	if pe != nil {
		found += len(pe.Parked) // parked rows took batch slots, so more may be due
	}
	if found > 0 {
		p.noteWrite()
	}
	res.found += found
	res.held = append(res.held, r.book.track(base, leases, sent)...)
	return true
}

// completeAndClaim sends the completions done, of leases (in done's
// order), with the claim req in one call (CompleteClaimer) and records
// their write as the writer records its own. When the call fails, done
// goes back to the writer, which writes it again: a completion that did
// commit then reports already applied. It returns the claim's leases and
// error.
func (r *run) completeAndClaim(ctx context.Context, done []pendingWrite, leases []leasing.Lease, req leasing.ClaimRequest) ([]leasing.Lease, error) {
	cc := r.p.store.(CompleteClaimer) // writer.merge checked it
	var (
		claimed  []leasing.Lease
		claimErr error
	)
	span, call := r.p.ev.writeStarted(writeComplete, done, func(ctx context.Context) (leasing.WriteResult, error) {
		res, ls, err := cc.CompleteAndClaim(ctx, leases, req)
		claimed, claimErr = ls, err
		if pe := (*leasing.ParkedError)(nil); errors.As(err, &pe) {
			return res, nil // the completions were written; the claim parked rows
		}
		return res, err
	})
	res, err := call(ctx)
	if err != nil {
		r.p.ev.writeAbandoned(span, "given back to the writer", err)
		r.w.resubmit(done)
		return nil, claimErr
	}
	r.w.recorded(span, writeComplete, done, res, nil)
	return claimed, claimErr
}

// releaseOpenWaiting releases, once a breaker has opened, the waiting leases
// (handlers not started) of the topics whose breaker is open, their
// attempts returned: they would only meet the unavailable destination.
// Leases claimed later (probes) are not released; those of a claim sent
// before the opening are, when it returns (releaseOpened).
func (r *run) releaseOpenWaiting() {
	n := r.p.breaker.openings()
	if n == r.openings {
		return
	}
	r.openings = n
	r.waiting = r.releaseOpen(r.waiting)
}

// releaseOpened returns the leases of res to queue for dispatch: all of
// them, unless a breaker opened while the claim was in flight; then the
// claim's leases of open topics are released. Probes' leases are kept
// here; like any waiting lease, a later opening may release them.
func (r *run) releaseOpened(res claimResult) []*heldLease {
	if r.p.breaker.openings() == res.openings {
		return res.held
	}
	return append(r.releaseOpen(res.held[:res.claimed]), res.held[res.claimed:]...)
}

// releaseOpen releases the leases of hs, whose handlers have not started,
// whose topic's breaker is open (errBreakerOpen), and returns the others.
func (r *run) releaseOpen(hs []*heldLease) []*heldLease {
	var keep, open []*heldLease
	for _, h := range hs {
		if r.p.breaker.isOpen(h.lease.Message) {
			open = append(open, h)
		} else {
			keep = append(keep, h)
		}
	}
	if len(open) > 0 {
		r.w.submit(r.book.stopWaiting(open, errBreakerOpen)...)
	}
	return keep
}

// checkPrivileges asks a PrivilegeChecker store whether its role may run
// the processor's statements and reports whether it may. A
// *leasing.PrivilegeError stops the processor; the check is asked again
// after another error.
func (r *run) checkPrivileges() bool {
	p := r.p
	c, ok := p.store.(PrivilegeChecker)
	if ok {
		ctx, cancel := context.WithTimeout(r.base, p.opts.LeaseDuration)
		defer cancel()
		err := c.CheckPrivileges(ctx)
		switch pe := (*leasing.PrivilegeError)(nil); {
		case errors.As(err, &pe):
			p.refuse(p.ev.privilegesMissing(err))
			return false
		case schemaBehind(err) != nil:
			p.ev.schemaBehind(schemaBehind(err))
			if p.opts.FailOnSchemaBehind {
				p.refuse(err)
			}
			return false
		case err != nil:
			p.ev.privilegeCheckFailed(err)
			return false
		}
	}
	r.allowed = true
	p.ev.running()
	return true
}

// sweepOrphans releases the rows leased to this processor's owner that it
// neither holds nor lost recently, and reports whether it succeeded. It
// runs between claims, so no claim of this processor is in flight.
func (r *run) sweepOrphans() bool {
	p := r.p
	known := r.book.known()
	ctx, cancel := context.WithTimeout(r.base, p.opts.LeaseDuration)
	defer cancel()
	if _, err := p.store.ReleaseOrphans(ctx, p.claimRequest.Owner, known); err != nil {
		p.ev.sweepFailed(err)
		return false
	}
	return true
}

// dispatch starts handler calls for waiting leases while slots are free.
func (r *run) dispatch() {
	if r.p.batch != nil {
		r.dispatchBatch()
		return
	}
	for r.running < r.p.opts.Concurrency && len(r.waiting) > 0 {
		h := r.waiting[0]
		r.waiting[0] = nil
		r.waiting = r.waiting[1:]
		if _, ok := r.book.advance(h, stateRunning); !ok {
			continue
		}
		r.running++
		if r.workers < r.running {
			r.workers++
			r.wg.Go(r.work)
		}
		r.started.put(h)
	}
}

// work is one of New's workers: it calls the handler for each lease it
// takes from started, until shutdown closes it.
func (r *run) work() {
	wake := make(chan struct{}, 1)
	for {
		h, ok := r.started.take(wake)
		if !ok {
			return
		}
		lease := r.book.lease(h)
		ctx := r.p.ev.processStarted(h, lease)
		if r.p.completesTx {
			ctx = withCommitGate(ctx, func() error { return r.book.committing(h) })
		}
		h.call.lease = h
		r.timeouts.start(&h.call)
		err := r.handle(ctx, lease)
		r.timeouts.stop(&h.call)
		r.finish(h, err)
		r.callFinished()
	}
}

// startWorker takes a slot and runs work, one NewBatch call, on a
// goroutine of its own.
func (r *run) startWorker(work func()) {
	r.running++
	r.wg.Go(func() {
		work()
		r.callFinished()
	})
}

// callFinished tells the loop that a handler call, and the outcome's
// submission, returned: its slot is free.
func (r *run) callFinished() {
	// One wake-up for all the calls that finish before the loop looks,
	// not one per call.
	r.finished.Add(1)
	select {
	case r.freed <- struct{}{}:
	default:
	}
}

// handle runs the handler on a worker, turning a panic into an error.
func (r *run) handle(ctx context.Context, lease leasing.Lease) (err error) {
	if err := exhausted(r.p.opts.RetryPolicy, lease); err != nil {
		return err
	}
	defer r.p.ev.handlerDone(time.Now(), &err) // after the recover below has set err
	defer func() {
		if v := recover(); v != nil {
			err = r.panicked([]leasing.Lease{lease}, v)
		}
	}()
	return r.p.handler(ctx, lease)
}

// exhausted returns the error that dead-letters lease without a handler
// call when its earlier attempts spent RetryPolicy.MaxAttempts (they ended
// without an outcome: a worker crashed or hung), else nil.
func exhausted(policy RetryPolicy, lease leasing.Lease) error {
	if !policy.DeadLetters(lease.Attempt - 1) {
		return nil
	}
	return fmt.Errorf("%w: attempt %d of at most %d", ErrAttemptsExhausted, lease.Attempt, policy.MaxAttempts)
}

// panicked logs the panic v of a handler call over leases, recovered by
// the caller's deferred function, and returns the error that fails each of
// them: errHandlerPanicked with v's text and the stack.
func (r *run) panicked(leases []leasing.Lease, v any) error {
	stack := debug.Stack()
	r.p.ev.handlerPanicked(leases, v, stack)
	return fmt.Errorf("%w: %v\n%s", errHandlerPanicked, v, stack)
}

// finish hands the outcome of h's handler, err, to the writer, unless h
// was lost or timed out.
func (r *run) finish(h *heldLease, err error) {
	if pw, ok := r.settle(h, err); ok {
		r.w.submit(pw)
	}
}

// settle returns the write of h's outcome err and ends h's context, or
// reports false when h was lost (its span ends so) or timed out meanwhile.
func (r *run) settle(h *heldLease, err error) (pendingWrite, bool) {
	lease, ok := r.book.advance(h, stateWriting)
	if !ok {
		if r.book.isLost(h) {
			r.p.ev.processLost(h)
		}
		return pendingWrite{}, false
	}
	r.p.ev.handlerReturned(h, err)
	pw := r.outcome(h, lease, err)
	h.cancel(context.Canceled)
	return pw, true
}

// outcome returns the write for lease's attempt ended with err: complete;
// by the handler's verdict, dead_lettered (Permanent) or released with a
// delay, the attempt returned (RetryAfter, capped at the RetryPolicy's
// MaxDelay; Unavailable, the breaker's delay); for a plain error, failed
// without delay after a shutdown, else failed with the policy's backoff or
// dead_lettered. It reports the verdict to the breaker.
func (r *run) outcome(h *heldLease, lease leasing.Lease, err error) pendingWrite {
	policy := r.p.opts.RetryPolicy
	pw := pendingWrite{h: h, kind: writeComplete, failure: leasing.Failure{Lease: lease}}
	if err == nil {
		r.p.breaker.succeeded(lease.Message)
		if r.p.completesTx {
			pw.kind = writeCommitted
		}
		return pw
	}
	pw.failure.Error = err.Error()
	var after time.Duration
	pw.verdict, after = VerdictOf(err)
	if pw.verdict != VerdictUnavailable {
		r.p.breaker.failed(lease.Message, time.Now())
	}
	switch {
	case pw.verdict == VerdictPermanent:
		pw.kind = writeDeadLetter
	case pw.verdict == VerdictRetryAfter:
		pw.kind = writeReleaseAfter
		pw.failure.RetryAfter = min(after, policy.MaxDelay)
	case pw.verdict == VerdictUnavailable:
		pw.kind = writeReleaseAfter
		pw.failure.RetryAfter = r.p.breaker.unavailable(lease.Message, time.Now())
	case errors.Is(context.Cause(h.ctx), ErrShutdown):
		pw.kind = writeFail
		pw.failure.Error = ErrShutdown.Error() + ": " + pw.failure.Error
	case policy.DeadLetters(lease.Attempt):
		pw.kind = writeDeadLetter
	default:
		pw.kind = writeFail
		pw.failure.RetryAfter = policy.Backoff(lease.Attempt)
	}
	return pw
}

// shutdown releases the waiting leases, lets running handlers finish within
// ShutdownGrace, cancels the rest, and waits for every write.
func (r *run) shutdown() {
	release := r.book.stopWaiting(r.waiting, ErrShutdown)
	r.waiting = nil
	if len(release) > 0 {
		r.w.submit(release...)
	}

	if r.started != nil {
		r.started.close() // the workers return once the leases put are worked
	}
	finished := make(chan struct{})
	go func() {
		r.wg.Wait()
		close(finished)
	}()
	grace := time.NewTimer(r.p.opts.ShutdownGrace)
	defer grace.Stop()
	select {
	case <-finished:
	case <-grace.C:
		r.book.cancelRunning(ErrShutdown)
		<-finished
	}
	r.timeouts.close()
	r.w.close()
}
