package leasing

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leasestore/leasestore/gen"
)

// The operator's calls (db/queries/operator.sql.tmpl, purge.sql.tmpl,
// read.sql.tmpl) run in the operator's class: plans left to the session.

// Requeue implements Store.Requeue with one statement.
func (s *Postgres) Requeue(ctx context.Context, ids ...uuid.UUID) (RequeueResult, error) {
	if err := validateIDs(ids); err != nil {
		return RequeueResult{}, err
	}
	requeue := bind(s.q.requeue, gen.InboxRequeueParams{Now: s.pinned(), MessageIds: idTexts(ids)})
	if err := s.send(ctx, operator, requeue); err != nil {
		return RequeueResult{}, fmt.Errorf("leasing: requeue %s: %w", s.queue, err)
	}
	return RequeueResult{Requested: len(ids), Requeued: requeue.out}, nil
}

// RequeueAll implements Store.RequeueAll in batches of at most MaxBatchSize
// rows, each its own statement and transaction, oldest dead letters first,
// until a batch finds none left. Only rows dead-lettered at or before the
// first batch's database now are taken, so a message dead-lettered again
// after its requeue is left for the next call and the loop ends.
//
// Not atomic: when a batch fails, the batches before it stay committed;
// calling RequeueAll again requeues the rest.
func (s *Postgres) RequeueAll(ctx context.Context) (RequeueResult, error) {
	requeued := []uuid.UUID{}
	var before *time.Time
	for {
		batch := bind(s.q.requeueBatch, gen.InboxRequeueBatchParams{Now: s.pinned(), DeadLetteredBefore: before, MaxRows: MaxBatchSize})
		if err := s.send(ctx, operator, batch); err != nil {
			return RequeueResult{}, fmt.Errorf("leasing: requeue %s (after %d requeued): %w", s.queue, len(requeued), err)
		}
		if len(batch.out) == 0 {
			break
		}
		for _, r := range batch.out {
			if r.Requeued {
				requeued = append(requeued, r.MessageID)
			}
			before = &r.RequeuedBefore
		}
	}
	slices.SortFunc(requeued, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	return RequeueResult{Requested: len(requeued), Requeued: requeued}, nil
}

// Purge implements Store.Purge: one DELETE of at most r.BatchSize rows,
// oldest finish time first, that skips rows locked by others. It reads the
// finished rows through their finish-time indexes and costs the rows it
// deletes, at any table size.
func (s *Postgres) Purge(ctx context.Context, r PurgeRequest) (int, error) {
	if err := r.validate(); err != nil {
		return 0, err
	}
	return s.purge(ctx, r)
}

// purge is Purge for a valid r, with lead sent first in each of its
// transactions (PurgeRetention's turn).
func (s *Postgres) purge(ctx context.Context, r PurgeRequest, lead ...step) (int, error) {
	now := s.pinned()
	purge := bind(s.q.purge, gen.InboxPurgeParams{
		Now: now, OlderThan: r.OlderThan, IncludeDeadLettered: r.IncludeDeadLettered, BatchSize: int32(r.BatchSize),
	})
	if err := s.send(ctx, operator, slices.Concat(lead, []step{purge})...); err != nil {
		return 0, fmt.Errorf("leasing: purge %s: %w", s.queue, err)
	}
	n := purge.out
	if r.IncludeDeadLettered && int(n) < r.BatchSize {
		// Dead letters that hold their keys (strict ordering) are purged
		// with their keys freed and the next messages promoted.
		heads := bind(s.q.purgeHeads, gen.InboxPurgeHeadsParams{Now: now, OlderThan: r.OlderThan, BatchSize: int32(r.BatchSize) - int32(n)})
		if err := s.send(ctx, operator, slices.Concat(lead, []step{heads, bind(s.q.keyAdvanceVacant, gen.InboxKeyAdvanceVacantParams{Now: now})})...); err != nil {
			return int(n), fmt.Errorf("leasing: purge %s (after %d deleted): %w", s.queue, n, err)
		}
		n += heads.out.Deleted
	}
	return int(n), nil
}

// Stats implements Store.Stats with up to three statements in one round
// trip, on any schema. Depth scans the table: call it every few seconds
// at most.
func (s *Postgres) Stats(ctx context.Context) (Stats, error) {
	now := s.pinned()
	counts := bind(s.q.countByStatus, struct{}{})
	health := bind(s.q.leaseHealth, gen.InboxLeaseHealthParams{Now: now})
	waiting := bind(s.q.orderingHealth, gen.InboxOrderingHealthParams{Now: now})
	steps := []step{counts, health}
	// The ordering keys' table exists from migration 00010 on; on an older
	// schema Stats reports no waiting head.
	if !s.skipCheck && s.schemaReady(ctx) == nil {
		steps = append(steps, waiting)
	}
	if err := s.send(ctx, anySchema, steps...); err != nil {
		return Stats{}, fmt.Errorf("leasing: stats %s: %w", s.queue, err)
	}
	if s.skipCheck {
		// Unchecked (leasectl doctor): asked on its own, and an undefined
		// table (SQLSTATE 42P01) means a schema before 00010.
		var pgErr *pgconn.PgError
		err := s.send(ctx, anySchema, waiting)
		if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42P01") {
			return Stats{}, fmt.Errorf("leasing: stats %s: %w", s.queue, err)
		}
	}
	st := Stats{
		Queue: s.queue, Depth: emptyDepth(s.queue), ExpiredLeases: health.out.ExpiredLeases, OldestDueAge: health.out.OldestDueAge,
	}
	for _, r := range counts.out {
		st.Depth[Status(r.Status)] = r.Messages
	}
	if len(waiting.out) > 0 {
		r := waiting.out[0]
		st.WaitingHead = &WaitingHead{TenantID: r.TenantID, OrderingKey: r.OrderingKey, Age: r.HeadAge}
		if r.HeadID != nil {
			st.WaitingHead.MessageID = *r.HeadID
		}
	}
	return st, nil
}

// Get implements Store.Get.
func (s *Postgres) Get(ctx context.Context, id uuid.UUID) (Row, error) {
	get := bind(s.q.get, gen.InboxGetParams{MessageID: id})
	err := s.send(ctx, operator, get)
	if errors.Is(err, ErrNotFound) {
		return Row{}, fmt.Errorf("%w: %s message %s", err, s.queue, id)
	}
	if err != nil {
		return Row{}, fmt.Errorf("leasing: get %s: %w", s.queue, err)
	}
	r, err := rowOf(s.queue, get.out)
	if err != nil {
		return Row{}, fmt.Errorf("leasing: get %s: %w", s.queue, err)
	}
	return r, nil
}
