package leasing

import (
	"context"
	"fmt"
	"time"

	"github.com/leasestore/leasestore/gen"
)

// Retention defaults, used for zero RetentionPolicy fields.
const (
	DefaultRetentionBatch    = 1000
	DefaultRetentionInterval = time.Minute
)

// RetentionPolicy says how long a queue keeps its finished rows before
// PurgeRetention deletes them. On the inbox the retention is the dedup
// window: a stored row's idempotency key turns a second enqueue of it into
// a duplicate, and once the row is purged the same key is accepted and
// handled again. MinDedupWindow makes that floor explicit.
type RetentionPolicy struct {
	// Finished is how long a completed (inbox) or published (outbox) row
	// is kept after it finished, > 0.
	Finished time.Duration
	// DeadLettered is how long a dead letter is kept after it was
	// dead-lettered, for requeue: 0 keeps dead letters until an operator
	// purges them; else at least Finished.
	DeadLettered time.Duration
	// MinDedupWindow, when > 0, is the shortest Finished (and DeadLettered,
	// when set) the policy accepts: the dedup window the inbox's producers
	// rely on. Honoured on the outbox too.
	MinDedupWindow time.Duration
	// BatchSize is the most rows one statement deletes,
	// 1..MaxBatchSize. Defaults to DefaultRetentionBatch.
	BatchSize int
	// Interval is the time between two runs of a processor that applies
	// the policy (processor.Options.Retention), > 0. Defaults to
	// DefaultRetentionInterval. PurgeRetention ignores it.
	Interval time.Duration
}

// Resolve returns p with its defaults filled in.
//
// Errors: an *ArgumentError for a Finished <= 0, a DeadLettered below
// Finished, a window below MinDedupWindow, or a BatchSize or Interval out
// of range.
func (p RetentionPolicy) Resolve() (RetentionPolicy, error) {
	if p.BatchSize == 0 {
		p.BatchSize = DefaultRetentionBatch
	}
	if p.Interval == 0 {
		p.Interval = DefaultRetentionInterval
	}
	switch {
	case p.Finished <= 0:
		return p, argumentError("retention finished", "must be > 0, got %s", p.Finished)
	case p.DeadLettered < 0 || p.DeadLettered > 0 && p.DeadLettered < p.Finished:
		return p, argumentError("retention dead lettered", "must be 0 (kept) or at least finished %s, got %s", p.Finished, p.DeadLettered)
	case p.MinDedupWindow < 0:
		return p, argumentError("retention min dedup window", "must be >= 0, got %s", p.MinDedupWindow)
	case p.Finished < p.MinDedupWindow:
		return p, argumentError("retention finished", "%s is shorter than the min dedup window %s", p.Finished, p.MinDedupWindow)
	}
	if err := validateCount("retention batch", p.BatchSize); err != nil {
		return p, err
	}
	if err := ValidatePositive("retention interval", p.Interval); err != nil {
		return p, err
	}
	return p, nil
}

// RetentionResult reports one PurgeRetention call.
type RetentionResult struct {
	// Finished is how many completed or published rows were deleted.
	Finished int
	// DeadLettered is how many rows the dead letters' statement deleted:
	// dead letters, and finished rows older than DeadLettered.
	DeadLettered int
}

// retentionLockName is the advisory lock name of queue q's retention turn.
func retentionLockName(q Queue) string { return "leasestore:retention:" + string(q) }

// PurgeRetention applies policy p once to the store's queue: up to
// p.BatchSize finished rows older than p.Finished, then, with
// p.DeadLettered, up to p.BatchSize dead letters older than that, each
// batch as Purge deletes it (oldest first, rows locked by others skipped,
// O(batch) at any table size). Each transaction first waits for the
// queue's retention turn, a transaction-level advisory lock, so that the
// processors and commands applying a policy to one queue run one at a
// time (behind a transaction-mode pooler too); the wait is bounded by
// PostgresOptions.LockTimeout. Call it until both counts are below
// p.BatchSize. The role needs DELETE on the queue's table
// (leasestore_operator has it; leasestore_processor has not).
//
// Errors: an *ArgumentError for a bad policy (see Resolve); an error
// matching ErrPermissionDenied for a role without DELETE; ErrLockTimeout
// when another runner held the turn too long; else as Purge's, the
// counts so far beside it.
func (s *Postgres) PurgeRetention(ctx context.Context, p RetentionPolicy) (RetentionResult, error) {
	p, err := p.Resolve()
	if err != nil {
		return RetentionResult{}, err
	}
	turn := bind(noRows(gen.New().RetentionTurn), gen.RetentionTurnParams{LockName: retentionLockName(s.queue)})
	var res RetentionResult
	if res.Finished, err = s.purge(ctx, PurgeRequest{OlderThan: p.Finished, BatchSize: p.BatchSize}, turn); err != nil {
		return res, fmt.Errorf("leasing: retention: %w", err)
	}
	if p.DeadLettered > 0 {
		turn := bind(noRows(gen.New().RetentionTurn), gen.RetentionTurnParams{LockName: retentionLockName(s.queue)})
		res.DeadLettered, err = s.purge(ctx, PurgeRequest{OlderThan: p.DeadLettered, BatchSize: p.BatchSize, IncludeDeadLettered: true}, turn)
		if err != nil {
			return res, fmt.Errorf("leasing: retention: %w", err)
		}
	}
	return res, nil
}

// Retained is what a queue's retention has kept: the finish times of its
// oldest stored rows, on the store's clock.
type Retained struct {
	// Now is the store's now when it was read.
	Now time.Time
	// OldestFinished is the completion (inbox) or publication (outbox)
	// time of the oldest completed or published row; nil when there is
	// none.
	OldestFinished *time.Time
	// OldestDeadLettered is the dead-letter time of the oldest dead
	// letter; nil when there is none.
	OldestDeadLettered *time.Time
}

// FinishedWindow is how far back the finished rows reach, Now less
// OldestFinished; 0 when none is stored. Purges delete the oldest first,
// so every row that finished within it is stored: on the inbox, the
// effective dedup window of finished messages.
func (r Retained) FinishedWindow() time.Duration {
	if r.OldestFinished == nil {
		return 0
	}
	return r.Now.Sub(*r.OldestFinished)
}

// Retained reads what the queue's retention has kept: two descents of the
// finish-time indexes. It works on any schema from migration 00008 on.
//
// Errors: as Store's.
func (s *Postgres) Retained(ctx context.Context) (Retained, error) {
	st := bind(s.q.retained, gen.InboxRetainedParams{Now: s.pinned()})
	if err := s.send(ctx, anySchema, st); err != nil {
		return Retained{}, fmt.Errorf("leasing: retained %s: %w", s.queue, err)
	}
	r := Retained{Now: st.out.Now.UTC(), OldestFinished: st.out.OldestDone, OldestDeadLettered: st.out.OldestDeadLettered}
	for _, t := range []*time.Time{r.OldestFinished, r.OldestDeadLettered} {
		if t != nil {
			*t = t.UTC()
		}
	}
	return r, nil
}
