package processor

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/leasestore/leasestore/internal/wait"
	"github.com/leasestore/leasestore/leasing"
)

// PreviousExpirer is a store that can end the leases an instance's earlier
// incarnations left (*leasing.Postgres, *leasing.Memory). A Processor with
// an Options.InstanceID calls it on start; that option needs DirectConfig,
// and so a *leasing.Postgres store.
type PreviousExpirer interface {
	// ExpirePrevious ends now the unexpired leases of the owners that
	// leasing.NewOwner(label) made, but owner's, for the next claim to
	// reclaim; see leasing.Postgres.ExpirePrevious.
	ExpirePrevious(ctx context.Context, label, owner string) ([]uuid.UUID, error)
}

var _ PreviousExpirer = (*leasing.Postgres)(nil)

// InstanceLockWait is how long Run tries to take an instance identity that
// another session holds before it refuses: after a crash the server frees
// the crashed session's lock only once it sees the connection closed,
// which may be a moment after the successor starts.
const InstanceLockWait = 2 * time.Second

// instanceRetry is the wait between two tries to take an identity held by
// another session.
const instanceRetry = 100 * time.Millisecond

// prepareDirect checks what Options.DirectConfig, InstanceID and
// Retention need of the store and creates the processor's own Listener.
//
// Errors: a *leasing.ArgumentError for a store that lacks what they need,
// or the Listener's.
func (p *Processor) prepareDirect() error {
	if _, ok := p.store.(Retainer); p.opts.retains() && !ok {
		return argumentError("retention", "needs a Retainer store (*leasing.Postgres), got %T", p.store)
	}
	if p.opts.DirectConfig == nil {
		return nil
	}
	if _, ok := p.store.(*leasing.Postgres); !ok {
		return argumentError("direct config", "needs a *leasing.Postgres store, got %T", p.store)
	}
	if p.opts.WorkSignal != nil {
		return nil
	}
	l, err := leasing.NewListener(p.opts.DirectConfig, p.store.Queue(), leasing.ListenerOptions{
		OnError: p.ev.listenerFailed, Logger: p.opts.Logger,
	})
	if err != nil {
		return err
	}
	p.listener = l
	p.wakes = make(chan struct{}, 1)
	p.opts.WorkSignal = WakeChan(p.wakes)
	return nil
}

// runListener runs the processor's own Listener until ctx ends, passing
// its wakes on and clearing its error in Health after each (one follows
// every LISTEN that delivers). It returns when the Listener has stopped.
func (p *Processor) runListener(ctx context.Context) (stop func()) {
	if p.listener == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{}, 2)
	go func() {
		defer func() { done <- struct{}{} }()
		if err := p.listener.Run(ctx); err != nil {
			p.ev.health.listener(err) // OnError had it; it stays in Health
		}
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		for {
			select {
			case <-ctx.Done():
				return
			case <-p.listener.Wake():
				p.ev.health.listener(nil)
				select {
				case p.wakes <- struct{}{}:
				default:
				}
			}
		}
	}()
	return func() {
		cancel()
		<-done
		<-done
	}
}

// holdInstance takes the processor's instance identity (takeOver) and
// watches it until release, which frees it; base outlives ctx's
// cancellation. Without an InstanceID it does nothing.
//
// Errors: takeOver's refusal.
func (p *Processor) holdInstance(ctx, base context.Context) (release func(), err error) {
	in, err := p.takeOver(ctx)
	if err != nil || in == nil {
		return func() {}, err
	}
	watchCtx, stopWatch := context.WithCancel(base)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		in.watch(watchCtx)
	}()
	return func() {
		stopWatch()
		<-watched
		in.close(base)
	}, nil
}

// instance is the identity a processor with an InstanceID holds while it
// runs.
type instance struct {
	p       *Processor
	lock    *leasing.InstanceLock // nil while lost
	running bool                  // the first claim may have run: a lost lock does not change the state
}

// takeOver takes the processor's instance identity and ends the leases of
// its earlier incarnations, trying again after other errors until shutdown
// is requested. It returns nil without an InstanceID, and a nil instance
// with a nil error when shutdown came first.
//
// Errors: the refusal Run returns: another live process holds the
// identity (*leasing.InstanceInUseError), or, with FailOnSchemaBehind, the
// *leasing.SchemaError.
func (p *Processor) takeOver(ctx context.Context) (*instance, error) {
	if p.opts.InstanceID == "" {
		return nil, nil
	}
	in := &instance{p: p}
	if err := in.relock(ctx); err != nil || in.lock == nil {
		return nil, err
	}
	exp, ok := p.store.(PreviousExpirer)
	if !ok {
		return in, nil // prepareDirect made sure it is a *leasing.Postgres
	}
	for {
		ids, err := exp.ExpirePrevious(ctx, p.opts.instanceLabel(), p.claimRequest.Owner)
		if err == nil {
			p.ev.tookOver(ids)
			return in, nil
		}
		if err := p.startFailed("expire previous leases", err); err != nil {
			in.close(ctx)
			return nil, err
		}
		if !p.sleep(ctx, p.opts.PollInterval) {
			in.close(ctx)
			return nil, nil
		}
	}
}

// startFailed records a failed start step and returns the refusal it
// makes: the *leasing.SchemaError with FailOnSchemaBehind, else nil.
func (p *Processor) startFailed(what string, err error) error {
	p.ev.instanceStepFailed(what, err)
	if se := schemaBehind(err); se != nil && p.opts.FailOnSchemaBehind {
		return se
	}
	return nil
}

// sleep waits d, and reports false when shutdown was requested or ctx
// ended first.
func (p *Processor) sleep(ctx context.Context, d time.Duration) bool {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-p.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return wait.Sleep(ctx, d)
}

// relock takes the identity, waiting up to InstanceLockWait while another
// session holds it and trying again after other errors, until it holds it
// or shutdown is requested (in.lock stays nil).
//
// Errors: the refusal of an identity still held after InstanceLockWait.
func (in *instance) relock(ctx context.Context) error {
	p := in.p
	var heldSince time.Time
	for {
		l, err := leasing.LockInstance(ctx, p.opts.DirectConfig, p.store.Queue(), p.opts.instanceLabel())
		wait := p.opts.PollInterval
		switch {
		case err == nil:
			in.lock = l
			return nil
		case errors.Is(err, leasing.ErrInstanceInUse):
			if heldSince.IsZero() {
				heldSince = time.Now()
			}
			if time.Since(heldSince) >= InstanceLockWait {
				return p.ev.instanceRefused(err)
			}
			wait = instanceRetry
		case in.running:
			heldSince = time.Time{}
			p.ev.instanceLockLost(err)
		default:
			heldSince = time.Time{}
			p.ev.instanceStepFailed("lock instance", err)
		}
		if !p.sleep(ctx, wait) {
			return nil
		}
	}
}

// watch checks the identity's session every HeartbeatInterval until ctx
// ends; when it ended, the identity is taken again, and a refusal stops
// the processor.
func (in *instance) watch(ctx context.Context) {
	p := in.p
	in.running = true
	for wait.Sleep(ctx, p.opts.HeartbeatInterval) {
		err := in.lock.Ping(ctx)
		if err == nil || ctx.Err() != nil {
			continue
		}
		p.ev.instanceLockLost(err)
		in.close(ctx)
		if err := in.relock(ctx); err != nil {
			p.refuse(err)
			return
		}
		if in.lock == nil {
			return
		}
	}
}

// close frees the identity.
func (in *instance) close(ctx context.Context) {
	if in.lock != nil {
		_ = in.lock.Close(ctx) // the session ends either way
		in.lock = nil
	}
}
