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

// BatchHandler works the leased messages of one claim in one call, for
// handlers that pay a round trip per call rather than per message (see
// BatchPublisher). It runs on a worker slot of a Processor made by
// NewBatch.
//
// leases holds 1..Options.BatchSize leases in claim order, less those lost
// before the call and those past RetryPolicy.MaxAttempts. The slice is the
// handler's to change; the leases go stale when the call returns. The
// handler returns one outcome per lease, in the same order, each written
// as a Handler's return would be; a slice of any other length, or a panic,
// fails every lease of the call ([ErrBatchLength]).
//
// ctx is cancelled as a Handler's is (timeout, shutdown), and when every
// lease of the call was lost; a lease lost while others are held is simply
// not written. Delivery is at least once: handlers must be idempotent.
// With Options.TracerProvider, ctx carries the call's span.
type BatchHandler func(ctx context.Context, leases []leasing.Lease) (errs []error)

// BatchPublisher publishes the messages of one claim to a broker in one
// call and returns one outcome per message, in order, as a BatchHandler.
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

// ErrBatchLength is wrapped by the error written for every lease of a
// BatchHandler call that returned the wrong number of outcomes.
var ErrBatchLength = errors.New("processor: batch handler returned the wrong number of outcomes")

// NewBatch returns a processor that passes the leases of each claim to
// handler in one call. It takes the Options of New; BatchSize is then the
// most leases a call receives, Concurrency the number of calls running at
// once, and HandlerTimeout bounds one call.
//
// Errors: as for New.
func NewBatch(store Store, handler BatchHandler, opts Options) (*Processor, error) {
	return newProcessor(store, handler != nil, opts, func(p *Processor) { p.batch = handler })
}

// dispatchBatch starts a worker per claim's waiting leases while slots
// are free: the loop claims only with a slot free, so they are one claim's.
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
	call := &timedCall{batch: hs, span: span, cancel: cancel}
	r.timeouts.start(call)
	errs := r.handleBatch(ctx, leases)
	timedOut := r.timeouts.stop(call)
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
	var failed error // the first error among errs, for the handler_duration result
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
