package processor

import (
	"context"
	"errors"

	"github.com/leasestore/leasestore/internal/wait"
	"github.com/leasestore/leasestore/leasing"
)

// Retainer is a store that applies a retention policy (*leasing.Postgres);
// a Processor with Options.Retention needs one.
type Retainer interface {
	// PurgeRetention applies the policy once; see
	// leasing.Postgres.PurgeRetention.
	PurgeRetention(ctx context.Context, p leasing.RetentionPolicy) (leasing.RetentionResult, error)
}

var _ Retainer = (*leasing.Postgres)(nil)

// retains reports whether Options.Retention is set.
func (o Options) retains() bool { return o.Retention != (leasing.RetentionPolicy{}) }

// startRetention runs keepRetained on a goroutine of its own until the
// returned stop, which waits for it.
func (p *Processor) startRetention(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.keepRetained(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// keepRetained applies the retention policy every Interval until ctx
// ends: PurgeRetention until a call deletes less than a batch of each
// kind. Errors go to OnError and the next run tries again, but a missing
// DELETE privilege, logged once, ends it.
func (p *Processor) keepRetained(ctx context.Context) {
	r, ok := p.store.(Retainer)
	if !ok || !p.opts.retains() {
		return
	}
	policy := p.opts.Retention
	for wait.Sleep(ctx, policy.Interval) {
		total := leasing.RetentionResult{}
		for {
			res, err := r.PurgeRetention(ctx, policy)
			total.Finished += res.Finished
			total.DeadLettered += res.DeadLettered
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				denied := errors.Is(err, leasing.ErrPermissionDenied)
				p.ev.retentionFailed(err, denied)
				if denied {
					return
				}
				break
			}
			if res.Finished < policy.BatchSize && res.DeadLettered < policy.BatchSize {
				break
			}
		}
		p.ev.retentionRan(total)
	}
}
