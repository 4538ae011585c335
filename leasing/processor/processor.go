package processor

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/leasestore/leasestore/leasing"
)

// Store is what a Processor calls on its lease store: the claim, renew and
// write methods of leasing.Store, with their contract. Every leasing.Store
// (*leasing.Postgres, *leasing.Memory) is one.
type Store interface {
	// Queue returns the queue the store serves.
	Queue() leasing.Queue
	// Claim leases up to r.BatchSize due messages to r.Owner; rows it
	// parked come back as a *leasing.ParkedError beside the leases.
	Claim(ctx context.Context, r leasing.ClaimRequest) ([]leasing.Lease, error)
	// Renew extends leases still held to the store's now + leaseFor.
	Renew(ctx context.Context, leaseFor time.Duration, leases ...leasing.Lease) (leasing.RenewResult, error)
	// Release gives leases back, due at once, their attempt returned.
	Release(ctx context.Context, leases ...leasing.Lease) (leasing.WriteResult, error)
	// ReleaseAfter gives leases back with their attempt returned, due
	// again after each RetryAfter, with each Error as the last error.
	ReleaseAfter(ctx context.Context, failures ...leasing.Failure) (leasing.WriteResult, error)
	// ReleaseOrphans releases the rows leased to owner whose leases have
	// not expired and whose ids are not in held.
	ReleaseOrphans(ctx context.Context, owner string, held []uuid.UUID) ([]uuid.UUID, error)
	// Complete writes the queue's success state.
	Complete(ctx context.Context, leases ...leasing.Lease) (leasing.WriteResult, error)
	// Fail writes failed, due again after each RetryAfter.
	Fail(ctx context.Context, failures ...leasing.Failure) (leasing.WriteResult, error)
	// DeadLetter writes dead_lettered.
	DeadLetter(ctx context.Context, failures ...leasing.Failure) (leasing.WriteResult, error)
}

var _ Store = leasing.Store(nil)

// Handler works one leased message: for the inbox it handles the message,
// for the outbox it publishes it (see Publisher). It runs on a worker slot
// of a Processor.
//
// ctx is cancelled, and the handler should return soon after, when the
// lease is lost (context.Cause(ctx) is leasing.ErrLeaseLost), when the call
// runs past Options.HandlerTimeout (ErrHandlerTimeout) or when shutdown's
// ShutdownGrace has run out (ErrShutdown). A nil return writes the queue's
// success state; an error or a panic writes failed or dead_lettered per the
// RetryPolicy. What it returns after its lease was lost or its timeout was
// written is not written. Delivery is at least once: handlers must be
// idempotent.
//
// Calls run on the Processor's worker goroutines, each running one call
// after another: a call that changes its goroutine's state (a
// runtime.LockOSThread left locked, pprof goroutine labels) leaves that
// state to the next call on the same worker.
type Handler func(ctx context.Context, lease leasing.Lease) error

// Publisher publishes one outbox message to a broker and returns nil once
// the broker has accepted it. ctx is cancelled as for a Handler.
type Publisher func(ctx context.Context, msg leasing.Message) error

// Handler returns p as a Handler for an outbox Processor.
func (p Publisher) Handler() Handler {
	return func(ctx context.Context, lease leasing.Lease) error { return p(ctx, lease.Message) }
}

// ErrShutdown is the cause of a handler context cancelled because
// ShutdownGrace ran out; the failed outcome then written carries its text.
var ErrShutdown = errors.New("processor: shut down")

// ErrHandlerTimeout is, by errors.Is, the cause of a handler context
// cancelled at Options.HandlerTimeout; the outcome then written carries its
// text and the timeout, e.g. "processor: handler timed out after 1m0s".
var ErrHandlerTimeout = errors.New("processor: handler timed out")

// errHandlerPanicked wraps the error of an attempt whose handler panicked.
var errHandlerPanicked = errors.New("processor: handler panicked")

// ErrAttemptsExhausted dead-letters, without a handler call, a message
// claimed past RetryPolicy.MaxAttempts: its earlier attempts ended without
// an outcome (the process crashed, say).
var ErrAttemptsExhausted = errors.New("processor: attempts exhausted without an outcome")

// Processor claims due messages of one store's queue and runs a handler on
// each; the package documentation and docs/processor.md describe its run.
type Processor struct {
	store        Store
	handler      Handler      // New's; nil for NewBatch's
	completesTx  bool         // NewTx's: a nil return committed the completion in the handler's transaction
	batch        BatchHandler // NewBatch's; nil for New's
	opts         Options      // resolved: no zero fields left
	ev           *events
	breaker      *breaker
	claimRequest leasing.ClaimRequest // what every claim sends, checked by New
	wrote        chan struct{}        // capacity 1: rows written since the vacuum policy last looked

	stop     chan struct{} // closed when shutdown is requested
	stopOnce sync.Once
	done     chan struct{} // closed when Run returns

	mu      sync.Mutex // guards started and refused
	started bool
	refused error // the first refusal (privilege, schema, instance); Run returns it

	listener *leasing.Listener // Options.DirectConfig's, nil without
	wakes    chan struct{}     // capacity 1: the listener's wakes, passed on as the WorkSignal
}

// PrivilegeChecker is a store that can tell, before the first claim,
// whether its role may run every statement a processor sends
// (*leasing.Postgres). Run asks it before its first claim, until it answers.
type PrivilegeChecker interface {
	// CheckPrivileges changes nothing and reports whether the store's role
	// may claim, renew, release and write every outcome.
	//
	// Errors: a *leasing.PrivilegeError when it may not; another error when
	// the check could not tell.
	CheckPrivileges(ctx context.Context) error
}

var _ PrivilegeChecker = (*leasing.Postgres)(nil)

// CompleteClaimer is a store that completes leases and claims the next
// batch in one transaction (*leasing.Postgres, *leasing.Memory). With
// Options.MergeCompletions, while a processor drains a backlog, the
// unkeyed completions its handlers return ride with its next claim: one
// commit where two would be, held at most 50 ms for it.
type CompleteClaimer interface {
	// CompleteAndClaim completes done as Complete does and then claims r
	// as Claim does; see leasing.Postgres.CompleteAndClaim. The leases it
	// returns are the caller's, as Claim's are (leasing.Store).
	CompleteAndClaim(ctx context.Context, done []leasing.Lease, r leasing.ClaimRequest) (leasing.WriteResult, []leasing.Lease, error)
}

var (
	_ CompleteClaimer = (*leasing.Postgres)(nil)
	_ CompleteClaimer = (*leasing.Memory)(nil)
)

// New returns a processor that claims from store and passes each message
// to handler. Call Run to start it.
//
// Errors: a *leasing.ArgumentError for a nil store or handler or a bad
// option; else the meter's error creating the instruments.
func New(store Store, handler Handler, opts Options) (*Processor, error) {
	return newProcessor(store, handler != nil, opts, func(p *Processor) { p.handler = handler })
}

// newProcessor is New and NewBatch; set gives p its handler.
func newProcessor(store Store, hasHandler bool, opts Options, set func(*Processor)) (*Processor, error) {
	if store == nil {
		return nil, argumentError("store", "must not be nil")
	}
	if !hasHandler {
		return nil, argumentError("handler", "must not be nil")
	}
	opts, claimRequest, err := opts.resolve(store.Queue())
	if err != nil {
		return nil, err
	}
	p := &Processor{
		store: store, opts: opts, claimRequest: claimRequest,
		stop: make(chan struct{}), done: make(chan struct{}), wrote: make(chan struct{}, 1),
	}
	set(p)
	if p.ev, err = newEvents(opts, store.Queue(), claimRequest, p.batch != nil); err != nil {
		return nil, err
	}
	if err := p.prepareDirect(); err != nil {
		return nil, err
	}
	p.breaker = newBreaker(opts.Breaker, opts.RetryPolicy, store.Queue(), p.ev)
	return p, nil
}

// noteWrite tells the vacuum policy that the processor wrote rows.
func (p *Processor) noteWrite() {
	select {
	case p.wrote <- struct{}{}:
	default:
	}
}

// Owner returns the lease owner name the processor claims with: the Owner
// label (Owner@InstanceID with an InstanceID) and a random suffix
// (leasing.NewOwner).
func (p *Processor) Owner() string { return p.claimRequest.Owner }

// Options returns the options in effect, defaults filled in.
func (p *Processor) Options() Options { return p.opts }

// Run claims and works messages until ctx is cancelled or Stop is called,
// then shuts down and returns once every handler has returned and every
// outcome has been written or given up. Store errors go to OnError and the
// work is tried again later. Values of ctx reach handlers and store calls;
// its cancellation does not cut them short.
//
// A role that lacks a privilege the processor needs stops it: Run claims
// nothing when the PrivilegeChecker finds one missing, and stops claiming
// when the database refuses an outcome write, and then returns that error.
//
// With an Options.InstanceID, Run first takes the instance's identity and
// ends its earlier incarnations' leases (docs/processor.md, Instance
// identity).
//
// Errors: an error at once on a second Run; an error matching
// leasing.ErrPermissionDenied (errors.As a *leasing.PrivilegeError when
// the check found it) for a missing privilege; a
// *leasing.InstanceInUseError when another live process holds the
// InstanceID; with FailOnSchemaBehind, the *leasing.SchemaError.
func (p *Processor) Run(ctx context.Context) error {
	p.mu.Lock()
	if p.started {
		p.mu.Unlock()
		return errors.New("processor: already ran")
	}
	p.started = true
	p.mu.Unlock()
	defer close(p.done)

	base := context.WithoutCancel(ctx)
	stopListener := p.runListener(base)
	defer stopListener()
	release, err := p.holdInstance(ctx, base)
	if err != nil {
		p.ev.health.set(StateStopped, err)
		return err
	}
	defer release()

	book := newBook(p.opts.LeaseDuration, p.ev)
	w := newWriter(p, book, base, outcomesWaitingPerSlot*p.opts.Concurrency)
	go w.run()
	hbCtx, stopHeartbeat := context.WithCancel(base)
	hbDone := make(chan struct{})
	go func() {
		defer close(hbDone)
		heartbeat{p: p, book: book}.run(hbCtx)
	}()

	vacCtx, stopVacuum := context.WithCancel(base)
	vacDone := make(chan struct{})
	go func() {
		defer close(vacDone)
		if v, ok := p.store.(Vacuumer); ok {
			_ = keepVacuumed(vacCtx, p.vacuumer(v), p.opts.Vacuum, p.ev.vacuumFailed, p.wrote) // the policy was validated by New
		}
	}()

	defer p.startRetention(base)()
	r := newRun(p, base, book, w)
	w.dueSoon = r.claimEarly
	p.breaker.wake = func() { r.claimEarly(0) }
	r.loop(ctx)
	p.ev.health.set(StateStopping, nil)
	stopVacuum() // frees its pool connection for the shutdown's writes
	<-vacDone
	r.shutdown()
	stopHeartbeat()
	<-hbDone
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ev.health.set(StateStopped, p.refused)
	return p.refused
}

// refuse stops the processor for err, which Run returns unless an earlier
// refusal came first. A missing privilege is StatePrivilegesRefused.
func (p *Processor) refuse(err error) {
	if errors.Is(err, leasing.ErrPermissionDenied) {
		p.ev.health.set(StatePrivilegesRefused, err)
	}
	p.mu.Lock()
	if p.refused == nil {
		p.refused = err
	}
	p.mu.Unlock()
	p.requestStop()
}

// Stop starts shutdown and waits for Run to return. It may be called more
// than once, or before Run (which then returns nil at once). Do not call it
// from a handler with a ctx that outlives the handler: Run waits for it.
//
// Errors: ctx.Err() when ctx ends first (shutdown goes on).
func (p *Processor) Stop(ctx context.Context) error {
	p.requestStop()
	p.mu.Lock()
	started := p.started
	p.mu.Unlock()
	if !started {
		return nil
	}
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *Processor) requestStop() { p.stopOnce.Do(func() { close(p.stop) }) }

// argumentError returns a *leasing.ArgumentError for field.
func argumentError(field, format string, args ...any) error {
	return &leasing.ArgumentError{Field: field, Reason: fmt.Sprintf(format, args...)}
}
