package leasing

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/leasestore/leasestore/gen"
)

// StrictOrdering reports whether strict ordering is on for the store's
// queue (see SetStrictOrdering).
//
// Errors: the driver error.
func (s *Postgres) StrictOrdering(ctx context.Context) (bool, error) {
	var strict bool
	err := s.pipelineSessionPlans(ctx, func(db gen.DBTX) (err error) {
		strict, err = gen.New().OrderingStrict(ctx, db, gen.OrderingStrictParams{Queue: string(s.queue)})
		return mapErr(err)
	})
	if err != nil {
		return false, fmt.Errorf("leasing: strict ordering %s: %w", s.queue, err)
	}
	return strict, nil
}

// SetStrictOrdering turns strict ordering on or off for the store's queue,
// for every process at once: it is stored in the database
// (leasestore_queue_settings) and read by every dead-letter write. With it
// on, a dead-lettered head keeps its key blocked until it is requeued or
// purged; off (the default), a dead-lettered head frees its key. The
// setting applies to heads dead-lettered from then on.
//
// Errors: the driver error.
func (s *Postgres) SetStrictOrdering(ctx context.Context, strict bool) error {
	err := s.pipelineSessionPlans(ctx, func(db gen.DBTX) error {
		return mapErr(gen.New().OrderingSetStrict(ctx, db, gen.OrderingSetStrictParams{Queue: string(s.queue), StrictOrdering: strict}))
	})
	if err != nil {
		return fmt.Errorf("leasing: set strict ordering %s: %w", s.queue, err)
	}
	return nil
}

// keySteps returns the pipeline steps that free the keys of the finished
// heads among ids and promote the next message of each: KeyLock, then
// KeyAdvance as a statement of its own, whose snapshot follows the locks
// (see db/queries/partials.sql.tmpl). None when ids is empty.
func (s *Postgres) keySteps(ctx context.Context, ids []uuid.UUID) []func(gen.DBTX) error {
	if len(ids) == 0 {
		return nil
	}
	now := s.pinned()
	return []func(gen.DBTX) error{
		func(db gen.DBTX) error { _, err := s.sql.keyLock(ctx, db, ids); return err },
		func(db gen.DBTX) error { _, err := s.sql.keyAdvance(ctx, db, now, ids); return err },
	}
}

// parkedKeysTimeout bounds releaseParked, which runs after the claim's
// context may have ended.
const parkedKeysTimeout = 10 * time.Second

// releaseParked frees the keys of rows a claim parked (dead-lettered) that
// were their keys' heads, in a transaction of its own after the claim's.
// The claim has committed the parking, so the release runs even when ctx
// has ended since, for at most parkedKeysTimeout. Should it fail, such a
// key stays blocked, as in strict ordering, until the parked row is
// requeued or purged; the error says so (ParkedError.KeysNotFreed).
func (s *Postgres) releaseParked(ctx context.Context, parked []ParkedRow) error {
	if len(parked) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), parkedKeysTimeout)
	defer cancel()
	ids := make([]uuid.UUID, len(parked))
	for i, p := range parked {
		ids[i] = p.ID
	}
	if err := s.pipelineSessionPlans(ctx, s.keySteps(ctx, ids)...); err != nil {
		return fmt.Errorf("leasing: free the keys of the messages the claim of %s parked: %w", s.queue, err)
	}
	return nil
}
