package leasing

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/metric"
)

// Handler works one leased message: for the inbox it handles the message,
// for the outbox it publishes it (see Publisher). It runs on a worker slot
// of a Processor.
//
// ctx is cancelled when the lease is lost (context.Cause(ctx) is
// ErrLeaseLost) or when the processor shuts down and ShutdownGrace has run
// out (context.Cause(ctx) is ErrShutdown); the handler should return soon
// after. A nil return writes the queue's success state; an error (or a
// panic) writes failed or dead_lettered per the RetryPolicy. Whatever it
// returns after its lease was lost is not written. Delivery is at least
// once: a handler may see the same message again after a lost lease or a
// crash, so it must be idempotent.
type Handler func(ctx context.Context, lease Lease) error

// Publisher publishes one outbox message to a broker, e.g. to msg.Topic.
// It returns nil once the broker has accepted the message. ctx is
// cancelled as for a Handler.
type Publisher func(ctx context.Context, msg Message) error

// Handler returns p as a Handler for an outbox Processor.
func (p Publisher) Handler() Handler {
	return func(ctx context.Context, lease Lease) error { return p(ctx, lease.Message) }
}

// WorkSignal wakes a Processor before its poll interval ends, e.g. a
// Listener on the queue's NOTIFY channel. Wake returns the same channel on
// every call; a receive on it makes the processor claim at once.
type WorkSignal interface {
	Wake() <-chan struct{}
}

// WakeChan adapts a channel to WorkSignal: each receive wakes the processor.
type WakeChan <-chan struct{}

// Wake returns c.
func (c WakeChan) Wake() <-chan struct{} { return c }

// ErrShutdown is the cause (context.Cause) of a handler context that a
// Processor cancelled because it was shutting down and ShutdownGrace ran
// out. The failed outcome it then writes carries this error's text.
var ErrShutdown = errors.New("leasing: processor shut down")

// ErrAttemptsExhausted is the error a Processor dead-letters a message with,
// without running its handler, when the message was claimed more than
// RetryPolicy.MaxAttempts times: the earlier attempts ended without an
// outcome, e.g. because the handler crashed its process.
var ErrAttemptsExhausted = errors.New("leasing: attempts exhausted without an outcome")

// Processor defaults, used for zero ProcessorOptions fields.
const (
	DefaultBatchSize     = 10
	DefaultLeaseDuration = 30 * time.Second
	DefaultConcurrency   = 4
	DefaultPollInterval  = time.Second
	DefaultShutdownGrace = 10 * time.Second
)

// MaxConcurrency is the most worker slots a Processor takes.
const MaxConcurrency = 10_000

// Outcome writes that fail with a driver error are tried this many times in
// all, waiting writeRetryDelay, then twice that, and so on, in between.
const (
	writeAttempts   = 5
	writeRetryDelay = 50 * time.Millisecond
)

// ProcessorOptions configures a Processor. The zero value of each field
// takes its documented default; negative values are rejected.
type ProcessorOptions struct {
	// Owner is the lease owner label; NewProcessor appends a random suffix
	// (NewOwner) so that processes started with the same label are told
	// apart. UTF-8 without NUL, at most MaxOwnerLabelBytes bytes. Defaults
	// to the queue name.
	Owner string
	// TenantID, when not empty, claims only that tenant's messages. UTF-8
	// without NUL.
	TenantID string
	// BatchSize is the most messages one claim takes, 1..MaxBatchSize.
	// Defaults to 10.
	BatchSize int
	// LeaseDuration is how long each claim and renew holds a message, from
	// the store's now, 1µs..MaxLeaseDuration. Defaults to 30 seconds.
	LeaseDuration time.Duration
	// HeartbeatInterval is the time between two renews of the processor's
	// leases, > 0 and at most LeaseDuration/2. Defaults to LeaseDuration/3.
	HeartbeatInterval time.Duration
	// Concurrency is the number of worker slots, that is of handlers
	// running at once, 1..MaxConcurrency. Defaults to 4.
	Concurrency int
	// PollInterval is the longest wait between two claims while slots are
	// free and the last claim found too few due messages, > 0. Defaults to
	// 1 second.
	PollInterval time.Duration
	// Retry decides the retry delay and when to dead-letter. Defaults to
	// the zero RetryPolicy (5 attempts, 1s doubling up to 5 minutes).
	Retry RetryPolicy
	// ShutdownGrace is how long running handlers may go on after shutdown
	// starts before their contexts are cancelled, > 0. Defaults to 10
	// seconds.
	ShutdownGrace time.Duration
	// Meter receives the processor counters (see NewProcessor). nil
	// records nothing.
	Meter metric.Meter
	// WorkSignal, when not nil, wakes the processor to claim before the
	// poll interval ends.
	WorkSignal WorkSignal
	// OnError, when not nil, receives the errors the processor handles by
	// trying again later: claim, renew and outcome-write failures, and
	// vacuum policy failures (ErrVacuumNotAllowed once, when the user may
	// not VACUUM the table). It may be called from several goroutines at
	// once and must not block.
	OnError func(error)
	// Vacuum is the policy by which the processor vacuums its queue's
	// table while it runs, on a store that can (Postgres; see
	// Postgres.KeepVacuumed): every processor of a queue may run it, at
	// most one VACUUM runs at a time. The zero value is on, with the
	// defaults; set Disabled to leave the table to autovacuum.
	Vacuum VacuumPolicy
}

// resolve returns o with defaults filled in for queue q, and the claim
// request the processor sends, its owner made from o.Owner. The claim's
// fields are checked by ClaimRequest.Validate.
//
// Errors: an *ArgumentError naming the first bad option.
func (o ProcessorOptions) resolve(q Queue) (ProcessorOptions, ClaimRequest, error) {
	if o.Owner == "" {
		o.Owner = string(q)
	}
	if o.BatchSize == 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	var claim ClaimRequest
	if err := ValidateOwnerLabel(o.Owner); err != nil {
		return o, claim, err
	}
	claim = ClaimRequest{Owner: NewOwner(o.Owner), BatchSize: o.BatchSize, LeaseFor: o.LeaseDuration, TenantID: o.TenantID}
	if err := claim.Validate(); err != nil {
		return o, claim, err
	}
	if o.HeartbeatInterval == 0 {
		o.HeartbeatInterval = o.LeaseDuration / 3
	}
	if o.HeartbeatInterval <= 0 || o.HeartbeatInterval > o.LeaseDuration/2 {
		return o, claim, argumentError("heartbeat interval", "must be > 0 and at most half the lease duration %s, got %s",
			o.LeaseDuration, o.HeartbeatInterval)
	}
	if o.Concurrency == 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.Concurrency < 1 || o.Concurrency > MaxConcurrency {
		return o, claim, argumentError("concurrency", "must be 1..%d, got %d", MaxConcurrency, o.Concurrency)
	}
	if o.PollInterval == 0 {
		o.PollInterval = DefaultPollInterval
	}
	if err := ValidatePositive("poll interval", o.PollInterval); err != nil {
		return o, claim, err
	}
	var err error
	if o.Vacuum, err = o.Vacuum.resolve(); err != nil {
		return o, claim, err
	}
	o.Retry = o.Retry.withDefaults()
	if err := o.Retry.validate(); err != nil {
		return o, claim, err
	}
	if o.ShutdownGrace == 0 {
		o.ShutdownGrace = DefaultShutdownGrace
	}
	if err := ValidatePositive("shutdown grace", o.ShutdownGrace); err != nil {
		return o, claim, err
	}
	return o, claim, nil
}

// Processor claims due messages of one store's queue, runs a Handler on
// each in a bounded number of worker slots, and writes each outcome under
// the lease's fence. One implementation serves the inbox (handler) and the
// outbox (Publisher.Handler).
//
// Lifecycle of a claimed message:
//
//   - Claim: a batch of up to BatchSize is claimed whenever fewer than
//     Concurrency leases are held, at once after a full batch, else after
//     PollInterval or a WorkSignal wake. At most Concurrency+BatchSize-1
//     leases are held; those beyond the free slots wait, FIFO. A claim call
//     is given LeaseDuration to return; after a failed one the processor
//     waits PollInterval, and for one LeaseDuration precedes each claim
//     with a ReleaseOrphans sweep: a failed claim may have committed
//     leases it never saw, which the sweep releases with their attempt
//     returned.
//   - Heartbeat: from its claim until its outcome is written, every lease
//     (waiting, running or being written) is renewed each HeartbeatInterval,
//     all of them with one Renew call whose deadline is the soonest moment
//     a lease may expire. A lease the store reports lost, that could not be
//     renewed within LeaseDuration of the last claim or renew that extended
//     it, or whose message this processor claims again under a newer
//     generation, is lost: its handler's context is cancelled with cause
//     ErrLeaseLost, lease_lost is counted, and its outcome is not written
//     (persist_skipped). The row then belongs to whoever reclaimed it, or
//     expires and is reclaimed: it stays retryable.
//   - Outcome: nil from the handler writes completed (inbox) or published
//     (outbox); an error or panic writes failed, due again after
//     Retry.Backoff(attempt) on the store's clock, with the error text, or
//     dead_lettered when the attempt is Retry.MaxAttempts or later. A message
//     claimed past MaxAttempts (its earlier attempts ended without an
//     outcome: the worker crashed) is dead-lettered with
//     ErrAttemptsExhausted without running the handler again. A retry
//     delay shorter than the time to the next poll brings that claim
//     forward. One writer writes outcomes, batching whatever is ready (one
//     call per kind of outcome); a write failing with a driver error is
//     tried up to 5 times in all, with backoff (a retried write that had
//     committed reports already_applied), then given up: the lease is no
//     longer renewed, so the row expires and is reclaimed. A write the
//     fence refuses counts persist_rejected. When Concurrency+1 outcomes
//     already wait for the writer, a worker queues its own and keeps its
//     slot until the writer has taken it, so a store slow to write stops
//     the claims.
//   - Shutdown (context cancelled or Stop): claiming stops; leases whose
//     handler has not started are released at once (Release: due again at
//     once, attempt returned); running handlers get ShutdownGrace, then
//     their contexts are cancelled with cause ErrShutdown. A handler that
//     returns an error after that cancel is written as failed with no retry
//     delay and ErrShutdown's text: the attempt counts, but a shutdown never
//     dead-letters, the next attempt decides. One that returns nil is
//     written as succeeded.
//   - Vacuum: on a Postgres store the processor runs Postgres.KeepVacuumed
//     with the Vacuum policy while it runs: VACUUM of the queue's table
//     once enough rows died, so that claims do not read ever more dead
//     index entries between two autovacuum visits.
//
// Clocks: lease expiry and visibility are the store's clock. The processor
// uses its own monotonic clock only for its timers and to bound each lease
// locally at LeaseDuration from the moment it sent the claim or renew that
// set the expiry, which is never later than the store's expiry.
//
// Counters on ProcessorOptions.Meter (Int64Counter, unit {message}), named
// litebus.<queue>.processor.<name>: leases_acquired, lease_lost, succeeded
// (inbox) or published (outbox), failed, dead_lettered, persist_skipped,
// persist_rejected.
type Processor struct {
	store   Store
	handler Handler
	opts    ProcessorOptions // resolved: no zero fields left
	owner   string
	metrics *processorMetrics

	stop     chan struct{} // closed when shutdown is requested
	stopOnce sync.Once
	done     chan struct{} // closed when Run returns

	mu      sync.Mutex
	started bool
	// held maps each message id to the live lease this processor holds on
	// it, from claim until its outcome is written or it is lost.
	held map[uuid.UUID]*heldLease
	// lostAt holds when each lease lost in the last LeaseDuration was given
	// up: an orphan sweep must not release those rows, whose attempt ran.
	lostAt map[uuid.UUID]time.Time
}

// leaseState is where a held lease is in its lifecycle.
type leaseState int

const (
	stateWaiting leaseState = iota // claimed, waiting for a worker slot
	stateRunning                   // its handler runs
	stateWriting                   // its outcome (or release) is being written
)

// heldLease is one lease a processor holds. Its fields are guarded by
// Processor.mu, except ctx and cancel which are set once.
type heldLease struct {
	lease    Lease
	deadline time.Time // local: the lease may have expired from then on
	state    leaseState
	lost     bool
	ctx      context.Context
	cancel   context.CancelCauseFunc
}

// NewProcessor returns a processor that claims from store and passes each
// message to handler. Call Run to start it.
//
// Errors: an *ArgumentError for a nil store or handler or a bad option;
// else the meter's error creating the counters.
func NewProcessor(store Store, handler Handler, opts ProcessorOptions) (*Processor, error) {
	if store == nil {
		return nil, argumentError("store", "must not be nil")
	}
	if handler == nil {
		return nil, argumentError("handler", "must not be nil")
	}
	opts, claim, err := opts.resolve(store.Queue())
	if err != nil {
		return nil, err
	}
	m, err := newProcessorMetrics(opts.Meter, store.Queue())
	if err != nil {
		return nil, err
	}
	return &Processor{
		store: store, handler: handler, opts: opts, owner: claim.Owner, metrics: m,
		stop: make(chan struct{}), done: make(chan struct{}), held: make(map[uuid.UUID]*heldLease), lostAt: make(map[uuid.UUID]time.Time),
	}, nil
}

// Owner returns the lease owner name the processor claims with: the Owner
// label and a random suffix.
func (p *Processor) Owner() string { return p.owner }

// Options returns the options in effect, defaults filled in.
func (p *Processor) Options() ProcessorOptions { return p.opts }

// Run claims and works messages until ctx is cancelled or Stop is called,
// then shuts down as the Processor doc describes and returns nil once every
// handler has returned and every outcome and release has been written (or
// given up after its retries). Store errors do not end Run: they go to
// OnError and the work is tried again later. Run blocks while a handler
// ignores its cancelled context. Values of ctx reach handlers and store
// calls; its cancellation does not cut them short.
//
// Errors: a Processor runs once; a second Run returns an error at once.
func (p *Processor) Run(ctx context.Context) error {
	p.mu.Lock()
	if p.started {
		p.mu.Unlock()
		return errors.New("leasing: processor already ran")
	}
	p.started = true
	p.mu.Unlock()
	defer close(p.done)

	base := context.WithoutCancel(ctx)
	w := newWriter(p, base, p.opts.Concurrency+1)
	go w.run()
	hbCtx, stopHeartbeat := context.WithCancel(base)
	hbDone := make(chan struct{})
	go func() {
		defer close(hbDone)
		p.heartbeat(hbCtx)
	}()

	vacCtx, stopVacuum := context.WithCancel(base)
	vacDone := make(chan struct{})
	go func() {
		defer close(vacDone)
		if v, ok := p.store.(vacuumer); ok {
			_ = v.KeepVacuumed(vacCtx, p.opts.Vacuum, p.report) // the policy was validated by resolve
		}
	}()

	r := &run{p: p, base: base, w: w, freed: make(chan struct{}, 1), retry: make(chan struct{}, 1)}
	w.onRetry = r.retrySoon
	r.loop(ctx)
	stopVacuum() // frees its pool connection for the shutdown's writes
	<-vacDone
	r.shutdown()
	stopHeartbeat()
	<-hbDone
	return nil
}

// vacuumer is a Store that can run a VacuumPolicy on its table.
type vacuumer interface {
	KeepVacuumed(ctx context.Context, policy VacuumPolicy, onError func(error)) error
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

func (p *Processor) report(err error) {
	if p.opts.OnError != nil {
		p.opts.OnError(err)
	}
}

// count adds n to counter c.
func count(c metric.Int64Counter, n int) {
	if n > 0 {
		c.Add(context.Background(), int64(n))
	}
}

// run is the state of one Run call. Its loop goroutine alone touches
// waiting and running; workers count themselves in finished and signal
// freed, and the writer calls retrySoon.
type run struct {
	p        *Processor
	base     context.Context // Run's values, never cancelled
	w        *writer
	waiting  []*heldLease   // claimed, in claim order, not started
	running  int            // workers started and not yet taken from finished
	finished atomic.Int64   // workers finished since the loop last looked
	freed    chan struct{}  // capacity 1: some worker finished since the loop last looked
	wg       sync.WaitGroup // workers

	// sweepUntil is set after a failed claim: until then, each claim is
	// preceded by a ReleaseOrphans sweep, since the failed claim may have
	// committed leases this processor never saw.
	sweepUntil time.Time

	retry   chan struct{} // a failed message is due again within retryIn
	retryMu sync.Mutex
	retryIn time.Duration // soonest retry delay written since the loop last looked; 0 for none
}

// retrySoon tells the loop that a message was written as failed with retry
// delay d, so that it claims then rather than at the next poll when that is
// sooner. d is on the store's clock; the loop treats it as a hint.
func (r *run) retrySoon(d time.Duration) {
	r.retryMu.Lock()
	if r.retryIn == 0 || d < r.retryIn {
		r.retryIn = max(d, time.Nanosecond)
	}
	r.retryMu.Unlock()
	select {
	case r.retry <- struct{}{}:
	default:
	}
}

// loop claims and dispatches until shutdown is requested.
func (r *run) loop(ctx context.Context) {
	p := r.p
	var wake <-chan struct{}
	if p.opts.WorkSignal != nil {
		wake = p.opts.WorkSignal.Wake()
	}
	poll := time.NewTimer(p.opts.PollInterval)
	defer poll.Stop()
	pollAt := time.Now().Add(p.opts.PollInterval)
	due := true // whether due messages may be waiting: claim when a slot frees
	for {
		r.dispatch()
		if ctx.Err() != nil {
			p.requestStop()
		}
		select {
		case <-p.stop:
			return
		default:
		}
		if due && r.running+len(r.waiting) < p.opts.Concurrency {
			due = r.claim()
			poll.Reset(p.opts.PollInterval)
			pollAt = time.Now().Add(p.opts.PollInterval)
			continue
		}
		select {
		case <-ctx.Done():
			p.requestStop()
			return
		case <-p.stop:
			return
		case <-poll.C:
			due = true
		case _, ok := <-wake:
			if !ok {
				wake = nil // a closed signal must not spin the loop
			}
			due = true
		case <-r.freed:
			r.running -= int(r.finished.Swap(0))
		case <-r.retry:
			r.retryMu.Lock()
			d := r.retryIn
			r.retryIn = 0
			r.retryMu.Unlock()
			if at := time.Now().Add(d); at.Before(pollAt) {
				poll.Reset(d)
				pollAt = at
			}
		}
	}
}

// claim takes one batch and queues it for dispatch. It reports whether the
// batch was full, so that more messages may be due.
func (r *run) claim() bool {
	p := r.p
	if time.Now().Before(r.sweepUntil) && !r.sweepOrphans() {
		return false
	}
	ctx, cancel := context.WithTimeout(r.base, p.opts.LeaseDuration)
	defer cancel()
	sent := time.Now()
	leases, err := p.store.Claim(ctx, ClaimRequest{
		Owner: p.owner, BatchSize: p.opts.BatchSize, LeaseFor: p.opts.LeaseDuration, TenantID: p.opts.TenantID,
	})
	if err != nil {
		p.report(fmt.Errorf("leasing: %s processor claim: %w", p.store.Queue(), err))
		// The claim may have committed before its reply was lost; its
		// leases would then count an attempt nobody ran. Past one lease
		// duration they have expired and been reclaimed anyway.
		r.sweepUntil = sent.Add(p.opts.LeaseDuration)
		return false
	}
	count(p.metrics.acquired, len(leases))
	r.waiting = append(r.waiting, p.track(r.base, leases, sent)...)
	return len(leases) == p.opts.BatchSize
}

// sweepOrphans releases the rows leased to this processor's owner that it
// neither holds nor lost recently, returning their attempts. It runs on the
// loop goroutine between claims, so no claim of this processor is in flight.
// Sweeps go on until sweepUntil, as the failed claim may commit on the server
// after the first sweep. It reports whether the sweep succeeded.
func (r *run) sweepOrphans() bool {
	p := r.p
	p.mu.Lock()
	p.pruneLost()
	known := make([]uuid.UUID, 0, len(p.held)+len(p.lostAt))
	for id := range p.held {
		known = append(known, id)
	}
	for id := range p.lostAt {
		known = append(known, id)
	}
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(r.base, p.opts.LeaseDuration)
	defer cancel()
	if _, err := p.store.ReleaseOrphans(ctx, p.owner, known); err != nil {
		p.report(fmt.Errorf("leasing: %s processor release orphans: %w", p.store.Queue(), err))
		return false
	}
	return true
}

// track starts holding leases claimed with a call sent at sent; their
// handler contexts carry base's values. A lease this processor still held
// on one of these messages under an older generation has evidently expired
// and been reclaimed: it is lost.
func (p *Processor) track(base context.Context, leases []Lease, sent time.Time) []*heldLease {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*heldLease, len(leases))
	for i, l := range leases {
		if old := p.held[l.Message.ID]; old != nil && old.state != stateWriting {
			p.markLost(old)
		}
		ctx, cancel := context.WithCancelCause(base)
		h := &heldLease{lease: l, deadline: sent.Add(p.opts.LeaseDuration), ctx: ctx, cancel: cancel}
		p.held[l.Message.ID] = h
		out[i] = h
	}
	return out
}

// rememberLost records that the lease on id was given up, so that orphan
// sweeps leave its row alone for one LeaseDuration. The caller holds p.mu.
func (p *Processor) rememberLost(id uuid.UUID) {
	p.lostAt[id] = time.Now()
	if len(p.lostAt) > 1024 {
		p.pruneLost()
	}
}

// pruneLost forgets leases given up more than LeaseDuration ago: they have
// expired, and the rows may be reclaimed by anyone. The caller holds p.mu.
func (p *Processor) pruneLost() {
	for id, at := range p.lostAt {
		if time.Since(at) > p.opts.LeaseDuration {
			delete(p.lostAt, id)
		}
	}
}

// markLost gives up h: its handler is cancelled and it is no longer
// renewed. The caller holds p.mu and has checked h.state != stateWriting.
func (p *Processor) markLost(h *heldLease) {
	if h.lost {
		return
	}
	h.lost = true
	h.cancel(ErrLeaseLost)
	p.rememberLost(h.lease.Message.ID)
	if p.held[h.lease.Message.ID] == h {
		delete(p.held, h.lease.Message.ID)
	}
	count(p.metrics.lost, 1)
}

// untrack stops holding the leases of g once their outcomes are written
// or given up.
func (p *Processor) untrack(g []pendingWrite) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pw := range g {
		if id := pw.h.lease.Message.ID; p.held[id] == pw.h {
			delete(p.held, id)
		}
	}
}

// dispatch starts handlers for waiting leases while slots are free.
func (r *run) dispatch() {
	for r.running < r.p.opts.Concurrency && len(r.waiting) > 0 {
		h := r.waiting[0]
		r.waiting[0] = nil
		r.waiting = r.waiting[1:]
		lease, ok := r.p.begin(h)
		if !ok {
			continue
		}
		r.running++
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			r.p.finish(h, r.p.call(h.ctx, lease), r.w)
			// One wake-up for all the workers that finish before the loop
			// looks, not one per worker.
			r.finished.Add(1)
			select {
			case r.freed <- struct{}{}:
			default:
			}
		}()
	}
}

// begin marks h running and returns its lease, or reports false when h was
// lost while it waited (counted persist_skipped).
func (p *Processor) begin(h *heldLease) (Lease, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if h.lost {
		count(p.metrics.skipped, 1)
		return Lease{}, false
	}
	h.state = stateRunning
	return h.lease, true
}

// call runs the handler, turning a panic into an error.
func (p *Processor) call(ctx context.Context, lease Lease) (err error) {
	if p.opts.Retry.DeadLetters(lease.Attempt - 1) {
		// Earlier attempts ended without an outcome (a worker crashed or
		// hung): do not run it again, dead-letter it.
		return fmt.Errorf("%w: attempt %d of at most %d", ErrAttemptsExhausted, lease.Attempt, p.opts.Retry.MaxAttempts)
	}
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("leasing: handler panicked: %v\n%s", v, debug.Stack())
		}
	}()
	return p.handler(ctx, lease)
}

// finish hands the outcome of h's handler to the writer, unless h was lost.
func (p *Processor) finish(h *heldLease, err error, w *writer) {
	p.mu.Lock()
	if h.lost {
		p.mu.Unlock()
		count(p.metrics.skipped, 1)
		return
	}
	h.state = stateWriting
	lease := h.lease
	p.mu.Unlock()
	pw := pendingWrite{h: h, kind: writeComplete, failure: Failure{Lease: lease}}
	if err != nil {
		pw.failure.Error = err.Error()
		switch {
		case errors.Is(context.Cause(h.ctx), ErrShutdown):
			pw.kind = writeFail
			pw.failure.Error = ErrShutdown.Error() + ": " + pw.failure.Error
		case p.opts.Retry.DeadLetters(lease.Attempt):
			pw.kind = writeDeadLetter
		default:
			pw.kind = writeFail
			pw.failure.RetryAfter = p.opts.Retry.Backoff(lease.Attempt)
		}
	}
	h.cancel(context.Canceled)
	w.submit(pw)
}

// shutdown releases the waiting leases, lets running handlers finish within
// ShutdownGrace, cancels the rest, and waits for every write.
func (r *run) shutdown() {
	p := r.p
	var release []pendingWrite
	p.mu.Lock()
	for _, h := range r.waiting {
		if h.lost {
			count(p.metrics.skipped, 1)
			continue
		}
		h.state = stateWriting
		h.cancel(ErrShutdown)
		release = append(release, pendingWrite{h: h, kind: writeRelease, failure: Failure{Lease: h.lease}})
	}
	p.mu.Unlock()
	r.waiting = nil
	if len(release) > 0 {
		r.w.submit(release...)
	}

	finished := make(chan struct{})
	go func() {
		r.wg.Wait()
		close(finished)
	}()
	grace := time.NewTimer(p.opts.ShutdownGrace)
	defer grace.Stop()
	select {
	case <-finished:
	case <-grace.C:
		p.mu.Lock()
		for _, h := range p.held {
			if h.state == stateRunning {
				h.cancel(ErrShutdown)
			}
		}
		p.mu.Unlock()
		<-finished
	}
	r.w.close()
}

// heartbeat renews the held leases every HeartbeatInterval until ctx ends.
func (p *Processor) heartbeat(ctx context.Context) {
	t := time.NewTicker(p.opts.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.renew(ctx)
		}
	}
}

// renew renews every held lease with one Renew call (one per MaxBatchSize
// leases) whose deadline is the soonest local lease deadline. Leases past
// their local deadline are lost without asking the store.
func (p *Processor) renew(ctx context.Context) {
	now := time.Now()
	var (
		leases   []Lease
		deadline time.Time
	)
	p.mu.Lock()
	for _, h := range p.held {
		if !h.deadline.After(now) {
			if h.state != stateWriting {
				p.markLost(h)
			}
			continue
		}
		leases = append(leases, h.lease)
		if deadline.IsZero() || h.deadline.Before(deadline) {
			deadline = h.deadline
		}
	}
	p.mu.Unlock()
	if len(leases) == 0 {
		return
	}
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	for len(leases) > 0 {
		batch := leases[:min(len(leases), MaxBatchSize)]
		leases = leases[len(batch):]
		sent := time.Now()
		res, err := p.store.Renew(rctx, p.opts.LeaseDuration, batch...)
		if err != nil {
			if ctx.Err() == nil { // not the heartbeat stopping
				p.report(fmt.Errorf("leasing: %s processor renew: %w", p.store.Queue(), err))
			}
			continue
		}
		p.applyRenew(batch, res, sent)
	}
}

// applyRenew records a Renew result for batch, sent at sent.
func (p *Processor) applyRenew(batch []Lease, res RenewResult, sent time.Time) {
	generation := make(map[uuid.UUID]int64, len(batch))
	for _, l := range batch {
		generation[l.Message.ID] = l.Generation
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range res.Renewed {
		if h := p.held[l.Message.ID]; h != nil && h.lease.Generation == l.Generation {
			h.lease.ExpiresAt = l.ExpiresAt
			h.deadline = sent.Add(p.opts.LeaseDuration)
		}
	}
	for _, id := range res.Lost {
		// A lease whose outcome is being written may have been finished
		// by that write before this renew ran: the write's result decides.
		if h := p.held[id]; h != nil && h.lease.Generation == generation[id] && h.state != stateWriting {
			p.markLost(h)
		}
	}
}

// writeKind is the store call a pendingWrite needs.
type writeKind int

const (
	writeRelease writeKind = iota
	writeComplete
	writeFail
	writeDeadLetter
)

// pendingWrite is one outcome waiting for the writer.
type pendingWrite struct {
	h       *heldLease
	kind    writeKind
	failure Failure // Lease always; RetryAfter and Error for fail and dead letter
}

// writer writes outcomes in batches: each write takes everything queued
// while the previous one ran.
type writer struct {
	p       *Processor
	base    context.Context
	onRetry func(time.Duration) // called with the retry delay of each failed write applied
	// limit is how many outcomes may wait without holding their worker: a
	// worker whose outcome finds limit or more waiting still queues it (the
	// next write takes it) but keeps its slot until the writer has taken
	// it, so that a slow store stops the claims instead of piling up
	// outcomes not yet written.
	limit int

	mu     sync.Mutex
	taken  sync.Cond      // on mu: the writer took the queue (takes grew)
	takes  uint64         // times the writer took the queue
	queue  []pendingWrite // submitted, not yet taken, in submit order
	closed bool
	ready  chan struct{} // capacity 1: queue or closed changed since the writer last looked
	done   chan struct{} // closed when run returns
}

// newWriter returns the writer of p's run; limit is how many outcomes may
// wait (see writer.limit). Call run to start it.
func newWriter(p *Processor, base context.Context, limit int) *writer {
	w := &writer{p: p, base: base, limit: limit, ready: make(chan struct{}, 1), done: make(chan struct{})}
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
	var groups [writeDeadLetter + 1][]pendingWrite
	for _, pw := range batch {
		groups[pw.kind] = append(groups[pw.kind], pw)
	}
	for kind, g := range groups {
		for len(g) > 0 {
			part := g[:min(len(g), MaxBatchSize)]
			g = g[len(part):]
			w.writeGroup(writeKind(kind), part)
		}
	}
}

func (w *writer) writeGroup(kind writeKind, g []pendingWrite) {
	p := w.p
	var (
		leases   []Lease   // release and complete
		failures []Failure // fail and dead letter
	)
	if kind == writeRelease || kind == writeComplete {
		leases = make([]Lease, len(g))
		for i, pw := range g {
			leases[i] = pw.failure.Lease
		}
	} else {
		failures = make([]Failure, len(g))
		for i, pw := range g {
			failures[i] = pw.failure
		}
	}
	call := func(ctx context.Context) (WriteResult, error) {
		switch kind {
		case writeRelease:
			return p.store.Release(ctx, leases...)
		case writeComplete:
			return p.store.Complete(ctx, leases...)
		case writeFail:
			return p.store.Fail(ctx, failures...)
		default:
			return p.store.DeadLetter(ctx, failures...)
		}
	}
	res, err := w.retry(call)
	p.untrack(g)
	if err != nil {
		// The handlers ran: an orphan sweep must not return these attempts.
		p.mu.Lock()
		for _, pw := range g {
			p.rememberLost(pw.h.lease.Message.ID)
		}
		p.mu.Unlock()
		p.report(fmt.Errorf("leasing: %s processor: gave up writing %d outcomes: %w", p.store.Queue(), len(g), err))
		return
	}
	done := 0
	for _, o := range res.Outcomes {
		if o.Outcome.Succeeded() {
			done++
		}
	}
	count(p.metrics.rejected, len(g)-done)
	switch kind {
	case writeComplete:
		count(p.metrics.succeeded, done)
	case writeFail:
		count(p.metrics.failed, done)
		for i, o := range res.Outcomes {
			if o.Outcome == OutcomeApplied && i < len(g) && w.onRetry != nil {
				w.onRetry(g[i].failure.RetryAfter)
			}
		}
	case writeDeadLetter:
		count(p.metrics.deadLettered, done)
	}
}

// retry calls call until it returns no error, an *ArgumentError, or
// writeAttempts calls failed; each call may take LeaseDuration.
func (w *writer) retry(call func(context.Context) (WriteResult, error)) (WriteResult, error) {
	delay := writeRetryDelay
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(w.base, w.p.opts.LeaseDuration)
		res, err := call(ctx)
		cancel()
		if err == nil || errors.Is(err, ErrInvalidArgument) || attempt == writeAttempts {
			return res, err
		}
		w.p.report(fmt.Errorf("leasing: %s processor outcome write, attempt %d: %w", w.p.store.Queue(), attempt, err))
		time.Sleep(delay)
		delay *= 2
	}
}
