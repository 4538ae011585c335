package processor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/leasestore/leasestore/leasing"
)

// BatchHandler works the leased messages of one claim at once, for
// handlers that pay a round trip per call rather than per message (an
// outbox relay publishing to a broker in batches; see BatchPublisher). It
// runs on a worker slot of a Processor made by NewBatch.
//
// leases holds 1..Options.BatchSize leases, in claim order: those one
// claim returned, less any lost before the call started and any past
// RetryPolicy.MaxAttempts (dead-lettered with ErrAttemptsExhausted without
// a call). The slice is a copy, the handler's to reorder or change; the
// processor matches outcomes to leases by its own copy. The leases go
// stale when the call returns: the processor writes their outcomes under
// their Generation fence and stops renewing them, so the row has its
// outcome, or is claimed again under a new generation, and a store call
// made later with one of them changes nothing; keep the messages, not the
// leases. The handler returns one outcome per lease, in the same
// order: errs[i] nil writes leases[i] with the queue's success state, an
// error writes it failed or dead_lettered per the RetryPolicy, as for a
// Handler. A slice of any other length is a handler bug: every lease of
// the call is then written failed, or dead-lettered at MaxAttempts, with
// an error wrapping ErrBatchLength. A panic fails every lease of the call with the
// panic's text and stack.
//
// ctx is cancelled when the call runs past Options.HandlerTimeout
// (context.Cause(ctx) is ErrHandlerTimeout by errors.Is; every lease of
// the call still held is then written failed, or dead-lettered at
// MaxAttempts, at once, and what the handler returns later is not
// written), when the processor shuts down and ShutdownGrace
// has run out (cause ErrShutdown), or when every lease of the call was
// lost (cause leasing.ErrLeaseLost). A lease lost while others are still
// held does not cancel ctx: its outcome is simply not written (counted
// lease_lost and persist_skipped), whatever errs holds for it. Delivery is
// at least once, as for a Handler: a handler may see a message again after
// a lost lease, a timeout or a crash, so it must be idempotent.
//
// With Options.TracerProvider, ctx carries the "process <queue>" span of
// the call, linked to the process span of each lease (the package
// documentation, Tracing).
type BatchHandler func(ctx context.Context, leases []leasing.Lease) (errs []error)

// BatchPublisher publishes the messages of one claim to a broker in one
// call, e.g. each to its msg.Topic. It returns one outcome per message, in
// the order of msgs: nil once the broker has accepted that message, else
// its error. ctx and the rules on the returned slice are those of a
// BatchHandler.
type BatchPublisher func(ctx context.Context, msgs []leasing.Message) (errs []error)

// Handler returns p as a BatchHandler for an outbox Processor (NewBatch).
func (p BatchPublisher) Handler() BatchHandler {
	return func(ctx context.Context, leases []leasing.Lease) []error {
		msgs := make([]leasing.Message, len(leases))
		for i, l := range leases {
			msgs[i] = l.Message
		}
		return p(ctx, msgs)
	}
}

// ErrBatchLength is wrapped by the error a Processor writes (as failed, or
// dead_lettered per the RetryPolicy) for every lease of a BatchHandler
// call that returned a slice whose length is not the number of leases it
// was given, for example "processor: batch handler returned the wrong
// number of outcomes: 2 for 3 messages".
var ErrBatchLength = errors.New("processor: batch handler returned the wrong number of outcomes")

// NewBatch returns a processor that claims from store and passes the
// leases of each claim to handler in one call (BatchHandler). Call Run to
// start it. It takes the Options of New, with these meanings:
//
//   - BatchSize is the most messages one claim takes, and so one handler
//     call receives (set it to the broker's limit per call);
//   - Concurrency is the number of handler calls running at once, so up to
//     Concurrency × BatchSize leases are held;
//   - HandlerTimeout bounds one handler call, whatever its size.
//
// Everything else is as for New: each lease of a call is renewed by the
// heartbeat until its outcome is written, the outcomes of a call are
// written together (one store call per kind of outcome), and shutdown
// releases claimed leases whose call has not started.
//
// Errors: a *leasing.ArgumentError (errors.Is leasing.ErrInvalidArgument)
// for a nil store or handler or a bad option; else the meter's error
// creating the counters.
func NewBatch(store Store, handler BatchHandler, opts Options) (*Processor, error) {
	return newProcessor(store, handler != nil, opts, func(p *Processor) { p.batch = handler })
}

// dispatchBatch starts a worker for each claim's waiting leases, up to
// BatchSize a call, while slots are free. The loop claims only while a
// slot is free and dispatches right after, so the leases waiting here are
// those of one claim.
func (r *run) dispatchBatch() {
	for r.running < r.p.opts.Concurrency && len(r.waiting) > 0 {
		n := min(len(r.waiting), r.p.opts.BatchSize)
		hs := make([]*heldLease, 0, n)
		leases := make([]leasing.Lease, 0, n)
		for _, h := range r.waiting[:n] {
			if lease, ok := r.book.advance(h, stateRunning); ok {
				hs = append(hs, h)
				leases = append(leases, lease)
			}
		}
		clear(r.waiting[:n])
		r.waiting = r.waiting[n:]
		if len(hs) == 0 {
			continue // all lost while they waited
		}
		r.startWorker(func() { r.workBatch(hs, leases) })
	}
}

// workBatch works the leases of one batch on a worker: each gets its
// process span; those past MaxAttempts are dead-lettered without a call,
// the others go to one handler call, whose outcomes are submitted
// together.
func (r *run) workBatch(hs []*heldLease, leases []leasing.Lease) {
	policy := r.p.opts.RetryPolicy
	var dead []pendingWrite
	keep := 0
	for i, h := range hs {
		l := leases[i]
		r.p.ev.processStarted(h, l)
		if err := exhausted(policy, l); err != nil {
			dead = append(dead, r.batchOutcomes([]*heldLease{h}, []error{err})...)
			continue
		}
		hs[keep], leases[keep] = h, l
		keep++
	}
	hs, leases = hs[:keep], leases[:keep]
	if len(dead) > 0 {
		r.w.submit(dead...)
	}
	if len(hs) == 0 {
		return
	}

	ctx, span := r.p.ev.batchStarted(r.base, hs)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(context.Canceled)
	stopWatch := watchBatch(hs, cancel)
	stopTimeout := r.startTimeout(hs, span, cancel)
	errs := r.handleBatch(ctx, leases)
	timedOut := stopTimeout()
	stopWatch()
	r.p.ev.batchEnded(span, errs, timedOut)
	if pws := r.batchOutcomes(hs, errs); len(pws) > 0 {
		r.w.submit(pws...)
	}
}

// watchBatch cancels the context of a batch call over hs, with cancel,
// when the processor's shutdown cancels their handler contexts (cause
// ErrShutdown) or when every one of them was lost (cause
// leasing.ErrLeaseLost). It returns the function that stops watching.
func watchBatch(hs []*heldLease, cancel context.CancelCauseFunc) (stop func()) {
	var lost atomic.Int64
	stops := make([]func() bool, len(hs))
	for i, h := range hs {
		stops[i] = context.AfterFunc(h.ctx, func() {
			switch cause := context.Cause(h.ctx); {
			case errors.Is(cause, ErrShutdown):
				cancel(ErrShutdown)
			case errors.Is(cause, leasing.ErrLeaseLost):
				if lost.Add(1) == int64(len(hs)) {
					cancel(leasing.ErrLeaseLost)
				}
			}
		})
	}
	return func() {
		for _, s := range stops {
			s()
		}
	}
}

// handleBatch runs the batch handler on a worker and returns one error per
// lease: a panic, or a result of the wrong length, fails every lease.
func (r *run) handleBatch(ctx context.Context, leases []leasing.Lease) (errs []error) {
	var failed error // the first error among errs, for the handler_duration outcome
	defer r.p.ev.handlerDone(time.Now(), &failed)
	defer func() {
		if v := recover(); v != nil {
			errs = repeatErr(len(leases), r.panicked(leases, v))
		}
		for _, err := range errs {
			if err != nil {
				failed = err
				break
			}
		}
	}()
	errs = r.p.batch(ctx, slices.Clone(leases))
	if len(errs) != len(leases) {
		err := fmt.Errorf("%w: %d for %d messages", ErrBatchLength, len(errs), len(leases))
		r.p.ev.batchWrongLength(leases, len(errs))
		errs = repeatErr(len(leases), err)
	}
	return errs
}

func repeatErr(n int, err error) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// batchOutcomes returns the writes for the leases of hs whose handler call
// ended with errs (one per lease), skipping those lost or timed out
// meanwhile: settle, as finish does for one lease.
func (r *run) batchOutcomes(hs []*heldLease, errs []error) []pendingWrite {
	pws := make([]pendingWrite, 0, len(hs))
	for i, h := range hs {
		if pw, ok := r.settle(h, errs[i]); ok {
			pws = append(pws, pw)
		}
	}
	return pws
}
