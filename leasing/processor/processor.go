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
// ctx is cancelled when the lease is lost (context.Cause(ctx) is
// leasing.ErrLeaseLost), when the call runs past Options.HandlerTimeout
// (context.Cause(ctx) is ErrHandlerTimeout, by errors.Is) or when the
// processor shuts down and ShutdownGrace has run out (context.Cause(ctx) is
// ErrShutdown); the handler should return soon after. A nil return writes
// the queue's success state; an error (or a panic) writes failed or
// dead_lettered per the RetryPolicy. Whatever it returns after its lease
// was lost or its timeout was written is not written. Delivery is at least
// once: a handler may see the same message again after a lost lease or a
// crash, so it must be idempotent.
type Handler func(ctx context.Context, lease leasing.Lease) error

// Publisher publishes one outbox message to a broker, e.g. to msg.Topic.
// It returns nil once the broker has accepted the message. ctx is
// cancelled as for a Handler.
type Publisher func(ctx context.Context, msg leasing.Message) error

// Handler returns p as a Handler for an outbox Processor.
func (p Publisher) Handler() Handler {
	return func(ctx context.Context, lease leasing.Lease) error { return p(ctx, lease.Message) }
}

// ErrShutdown is the cause (context.Cause) of a handler context that a
// Processor cancelled because it was shutting down and ShutdownGrace ran
// out. The failed outcome it then writes carries this error's text.
var ErrShutdown = errors.New("processor: shut down")

// ErrHandlerTimeout is, by errors.Is, the cause (context.Cause) of a
// handler context that a Processor cancelled because the handler ran past
// Options.HandlerTimeout. The failed (or dead-lettered) outcome written
// for that attempt carries its text and the timeout, for example
// "processor: handler timed out after 1m0s".
var ErrHandlerTimeout = errors.New("processor: handler timed out")

// errHandlerPanicked wraps the error of an attempt whose handler panicked.
var errHandlerPanicked = errors.New("processor: handler panicked")

// ErrAttemptsExhausted is the error a Processor dead-letters a message with,
// without running its handler, when the message was claimed more than
// RetryPolicy.MaxAttempts times: the earlier attempts ended without an
// outcome, e.g. because the handler crashed its process.
var ErrAttemptsExhausted = errors.New("processor: attempts exhausted without an outcome")

// Processor claims due messages of one store's queue, runs a Handler on
// each in a bounded number of worker slots, and writes each outcome under
// the lease's fence. The package documentation describes the lifecycle of
// a claimed message; Options, the knobs.
type Processor struct {
	store   Store
	handler Handler      // New's; nil for NewBatch's
	batch   BatchHandler // NewBatch's; nil for New's
	opts    Options      // resolved: no zero fields left
	ev      *events
	// claimRequest is what every claim sends: owner, batch size, lease
	// duration and tenant, checked by New.
	claimRequest leasing.ClaimRequest

	// wrote holds one value after the processor wrote rows (a claim that
	// took messages, an outcome write) since the vacuum policy last took
	// it: the policy reads the dead-row count only then.
	wrote chan struct{}

	stop     chan struct{} // closed when shutdown is requested
	stopOnce sync.Once
	done     chan struct{} // closed when Run returns

	mu      sync.Mutex // guards started and refused
	started bool
	// refused is the first refusal for lack of a privilege that stopped
	// the processor (the privilege check's, or an outcome write's); Run
	// returns it.
	refused error
}

// PrivilegeChecker is implemented by stores that can tell, before the
// first claim, whether their role may run every statement a processor
// sends (leasing.Postgres.CheckPrivileges). Run calls it before its first
// claim, until it answers. A store that wraps a *leasing.Postgres without
// embedding it is not checked unless it implements this too.
type PrivilegeChecker interface {
	// CheckPrivileges changes nothing and reports whether the store's role
	// may claim, renew, release and write every outcome.
	//
	// Errors: a *leasing.PrivilegeError (errors.Is
	// leasing.ErrPermissionDenied) when it may not; any other error when
	// the check could not tell, and Run asks again at its next poll.
	CheckPrivileges(ctx context.Context) error
}

var _ PrivilegeChecker = (*leasing.Postgres)(nil)

// New returns a processor that claims from store and passes each message
// to handler. Call Run to start it.
//
// Errors: a *leasing.ArgumentError (errors.Is leasing.ErrInvalidArgument)
// for a nil store or handler or a bad option; else the meter's error
// creating the counters.
func New(store Store, handler Handler, opts Options) (*Processor, error) {
	return newProcessor(store, handler != nil, opts, func(p *Processor) { p.handler = handler })
}

// newProcessor returns the processor of New and NewBatch over store with
// opts, after set has given it its handler, or the errors of New for a nil
// store, no handler (hasHandler false) or a bad option, checked in that
// order.
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
// label and a random suffix (leasing.NewOwner).
func (p *Processor) Owner() string { return p.claimRequest.Owner }

// Options returns the options in effect, defaults filled in.
func (p *Processor) Options() Options { return p.opts }

// Run claims and works messages until ctx is cancelled or Stop is called,
// then shuts down as the package documentation describes and returns nil
// once every handler has returned and every outcome and release has been
// written (or given up after its write attempts). Store errors do not end
// Run: they go to OnError and the work is tried again later, except the
// refusals for lack of a privilege described below. Run blocks while a
// handler ignores its cancelled context. Values of ctx reach handlers and
// store calls; its cancellation does not cut them short.
//
// Before its first claim, Run asks a store that implements
// PrivilegeChecker whether its role may run every statement the processor
// sends. Until the check answers (when the database is unreachable, say,
// or the store's schema check fails), its error goes to OnError and the
// check is tried again at each poll, in place of a claim. When the role
// lacks a privilege, Run claims nothing and returns an error wrapping the
// *leasing.PrivilegeError (also passed to OnError): its handlers would
// otherwise run, fail to record their outcomes and run again after every
// lease expiry. Should the database later refuse an outcome write for lack
// of a privilege (privileges revoked while it runs), the processor stops
// claiming at once, shuts down as above and Run returns that error; a
// revoke that is undone at once still stops it. Claims and orphan sweeps
// refused later are retried, as other store errors; a renewal refused
// later leaves its leases to expire, and the outcome writes of their
// handlers are then refused too.
//
// Errors: a Processor runs once; a second Run returns an error at once. A
// missing privilege: an error matching leasing.ErrPermissionDenied (and
// errors.As a *leasing.PrivilegeError when the check found it).
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
			_ = keepVacuumed(vacCtx, p.vacuumer(v), p.opts.Vacuum, p.ev.report, p.wrote) // the policy was validated by New
		}
	}()

	r := newRun(p, base, book, w)
	w.dueSoon = r.claimEarly
	r.loop(ctx)
	stopVacuum() // frees its pool connection for the shutdown's writes
	<-vacDone
	r.shutdown()
	stopHeartbeat()
	<-hbDone
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused
}

// refuse stops the processor because the database refuses its role what
// it needs (err matches leasing.ErrPermissionDenied): Run returns the
// first such error once shut down.
func (p *Processor) refuse(err error) {
	p.mu.Lock()
	if p.refused == nil {
		p.refused = err
	}
	p.mu.Unlock()
	p.requestStop()
}

// Stop starts shutdown, as cancelling Run's context does, and waits for Run
// to return. Calling it more than once, or before Run, is fine: a Run that
// starts after Stop returns nil at once.
//
// Errors: ctx.Err() when ctx ends before Run returns (shutdown goes on).
// Do not call Stop from a handler with a ctx that outlives the handler: Run
// waits for that handler, so Stop would wait for itself.
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

// pause waits d, or until ctx ends, and reports whether d passed.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// argumentError returns a *leasing.ArgumentError for field.
func argumentError(field, format string, args ...any) error {
	return &leasing.ArgumentError{Field: field, Reason: fmt.Sprintf(format, args...)}
}
