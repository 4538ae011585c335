package leasing

import (
	"context"
	"fmt"

	"github.com/leasestore/leasestore/gen"
)

// Pause pauses the store's queue, or topics of it, in the database
// (leasestore_paused, migration 00015), for every processor at once: from
// its commit on no claim takes a message that is paused, nor reclaims its
// expired lease; leases already held run to their end. A processor stops
// claiming what is paused with its next claim, within one poll interval.
// Pausing what is paused already keeps the first pause's By and time.
//
// Errors: an *ArgumentError for a bad r (nothing changed); the driver
// error.
func (s *Postgres) Pause(ctx context.Context, r PauseRequest) error {
	if err := r.Validate(false); err != nil {
		return err
	}
	put := bind(gen.New().PausePut, gen.PausePutParams{Queue: string(s.queue), PausedBy: r.By, Now: s.pinned(), Topics: r.pauseKeys()})
	if err := s.send(ctx, operator, put); err != nil {
		return fmt.Errorf("leasing: pause %s: %w", s.queue, err)
	}
	return nil
}

// Resume removes the pauses r names (a whole-queue pause with WholeQueue,
// else each topic's); pauses it does not name stay. When it removed any
// it notifies the queue's work channel (Listener), so that processors
// claim at once. Resuming what is not paused changes nothing.
//
// Errors: an *ArgumentError for a bad r (nothing changed); the driver
// error.
func (s *Postgres) Resume(ctx context.Context, r PauseRequest) error {
	if err := r.Validate(true); err != nil {
		return err
	}
	del := bind(gen.New().PauseDelete, gen.PauseDeleteParams{Queue: string(s.queue), Topics: r.pauseKeys(), Channel: s.queue.Channel()})
	if err := s.send(ctx, operator, del); err != nil {
		return fmt.Errorf("leasing: resume %s: %w", s.queue, err)
	}
	return nil
}

// Paused returns the store's queue's pauses in place, by topic; the
// whole-queue pause (Topic "") first. Never nil.
//
// Errors: the driver error.
func (s *Postgres) Paused(ctx context.Context) ([]Pause, error) {
	list := bind(gen.New().PauseList, gen.PauseListParams{Queue: string(s.queue)})
	if err := s.send(ctx, operator, list); err != nil {
		return nil, fmt.Errorf("leasing: paused %s: %w", s.queue, err)
	}
	out := make([]Pause, 0, len(list.out))
	for _, p := range list.out {
		out = append(out, Pause{Queue: s.queue, Topic: p.Topic, By: p.PausedBy, At: p.PausedAt.UTC()})
	}
	return out, nil
}
