package leasing

import (
	"bytes"
	"context"
	"fmt"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/leasestore/leasestore/gen"
)

// The operator's reads and bulk actions by filter (db/queries/read.sql.tmpl,
// purge.sql.tmpl): Postgres only; Memory has none of them.

// List returns one page of the messages r.Filter matches, in (Status,
// CreatedAt, ID) order (statuses by name), after r.After: status by status,
// one statement per status until the page is full. A status's statement
// reads the queue's list index (migration 00017), or for the in-flight
// status its in-flight index, from the cursor on, so a page costs its rows
// plus those the filter's other fields skip, at any table size.
//
// Errors: an *ArgumentError for a bad filter, limit or cursor (one of
// another status than the filter's).
//
// SQL: db/queries/read.sql.tmpl (InboxList).
func (s *Postgres) List(ctx context.Context, r ListRequest) (ListPage, error) {
	if err := r.validate(s.queue); err != nil {
		return ListPage{}, err
	}
	f := filterParams(r.Filter)
	page := ListPage{Rows: []Row{}}
	for _, st := range listStatuses(s.queue, r) {
		after := r.After
		if after.Status != st {
			after = Cursor{Status: st}
		}
		list := bind(s.q.list, gen.InboxListParams{
			ListStatus: string(st), AfterCreatedAt: after.CreatedAt, AfterMessageID: after.ID,
			MessageType: f.MessageType, TenantID: f.TenantID, OrderingKey: f.OrderingKey,
			IdempotencyKey: f.IdempotencyKey, Topic: f.Topic, ErrorContains: f.ErrorContains, OlderThan: f.OlderThan,
			Now: s.pinned(), MaxRows: int32(r.Limit - len(page.Rows)),
		})
		if err := s.send(ctx, listing, list); err != nil {
			return ListPage{}, fmt.Errorf("leasing: list %s: %w", s.queue, err)
		}
		for _, row := range list.out {
			converted, err := rowOf(s.queue, row)
			if err != nil {
				return ListPage{}, fmt.Errorf("leasing: list %s: %w", s.queue, err)
			}
			page.Rows = append(page.Rows, converted)
		}
		if len(page.Rows) == r.Limit {
			page.Next = CursorOf(page.Rows[len(page.Rows)-1])
			break
		}
	}
	return page, nil
}

// listStatuses returns the statuses List reads for r, in order: the
// filter's, or from the cursor's on, every status of q sorted by name.
func listStatuses(q Queue, r ListRequest) []Status {
	if r.Filter.Status != "" {
		return []Status{r.Filter.Status}
	}
	all := slices.Clone(q.Statuses())
	slices.Sort(all)
	if !r.After.IsZero() {
		all = all[slices.Index(all, r.After.Status):]
	}
	return all
}

// CountMatching returns how many messages f matches at the database's now.
// It reads every match (a range of the list index when f.Status is set).
//
// Errors: an *ArgumentError for a bad filter.
//
// SQL: db/queries/read.sql.tmpl (InboxCountMatching).
func (s *Postgres) CountMatching(ctx context.Context, f ListFilter) (int64, error) {
	if err := f.validate(s.queue); err != nil {
		return 0, err
	}
	count := bind(s.q.countMatching, filterParams(f))
	count.arg.Now = s.pinned()
	if err := s.send(ctx, listing, count); err != nil {
		return 0, fmt.Errorf("leasing: count %s: %w", s.queue, err)
	}
	return count.out, nil
}

// filterParams is f as the filter's nullable parameters (now unset).
func filterParams(f ListFilter) gen.InboxCountMatchingParams {
	p := gen.InboxCountMatchingParams{
		Status: nullable(string(f.Status)), MessageType: nullable(f.Type), TenantID: nullable(f.TenantID),
		OrderingKey: nullable(f.OrderingKey), IdempotencyKey: nullable(f.IdempotencyKey), Topic: nullable(f.Topic),
		ErrorContains: nullable(f.ErrorContains),
	}
	if f.OlderThan > 0 {
		p.OlderThan = pgtype.Interval{Microseconds: f.OlderThan.Microseconds(), Valid: true}
	}
	return p
}

// DeadLetterGroups returns the queue's dead letters grouped by last error,
// the largest group first, at most limit (1..MaxBatchSize) groups. It reads
// every dead letter: for an operator's page, not a hot loop.
//
// Errors: an *ArgumentError for a bad limit.
//
// SQL: db/queries/read.sql.tmpl (InboxDeadLetterGroups).
func (s *Postgres) DeadLetterGroups(ctx context.Context, limit int) ([]DeadLetterGroup, error) {
	if err := validateCount("group limit", limit); err != nil {
		return nil, err
	}
	groups := bind(s.q.deadLetterGroups, gen.InboxDeadLetterGroupsParams{MaxRows: int32(limit)})
	if err := s.send(ctx, operator, groups); err != nil {
		return nil, fmt.Errorf("leasing: dead-letter groups %s: %w", s.queue, err)
	}
	out := make([]DeadLetterGroup, len(groups.out))
	for i, g := range groups.out {
		out[i] = DeadLetterGroup{LastError: g.LastError, Messages: g.Messages, FirstAt: g.FirstAt.UTC(), LastAt: g.LastAt.UTC()}
	}
	return out, nil
}

// BulkCount returns how many messages r would read: those r.Filter matches
// in the statuses r.Action acts on, counted at the database's now (a
// dry run; messages may come or go before Bulk runs).
//
// Errors: an *ArgumentError for a bad request, as Bulk.
func (s *Postgres) BulkCount(ctx context.Context, r BulkRequest) (int64, error) {
	if err := r.validate(s.queue); err != nil {
		return 0, err
	}
	var total int64
	for _, st := range bulkStatuses(s.queue, r) {
		f := r.Filter
		f.Status = st
		n, err := s.CountMatching(ctx, f)
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

// bulkStatuses returns the statuses Bulk reads for r: the filter's, or
// every status the action acts on.
func bulkStatuses(q Queue, r BulkRequest) []Status {
	if r.Filter.Status != "" {
		return []Status{r.Filter.Status}
	}
	return r.Action.statuses(q)
}

// Bulk does r.Action to every message r.Filter matches, one page of at
// most r.BatchSize messages per transaction, status by status in List's
// order, each page read after the previous one's last message: a message
// that enters the filter behind that point during the call is left for
// the next call. Each batch goes through the fenced calls: Requeue;
// DeadLetterByID for each message (in message_id order, its key freed as
// DeadLetterByID frees it; a waiting message in a transaction of its own);
// for purge, a DELETE (skipping rows others hold locked) of the messages not in
// flight that frees the keys they held and promotes each key's next
// message.
//
// Not atomic: when a batch fails, those before it stay committed; the
// error says how many were applied, and calling again does the rest.
//
// Errors: an *ArgumentError for a bad request (nothing changed).
//
// SQL: db/queries/operator.sql.tmpl, purge.sql.tmpl (InboxPurgeByIDs).
func (s *Postgres) Bulk(ctx context.Context, r BulkRequest) (BulkResult, error) {
	if err := r.validate(s.queue); err != nil {
		return BulkResult{}, err
	}
	var res BulkResult
	for _, st := range bulkStatuses(s.queue, r) {
		f := r.Filter
		f.Status = st
		req := ListRequest{Filter: f, Limit: r.BatchSize}
		for {
			page, err := s.List(ctx, req)
			if err != nil {
				return res, fmt.Errorf("leasing: %s %s (after %d applied): %w", r.Action, s.queue, res.Applied, err)
			}
			if len(page.Rows) == 0 {
				break
			}
			applied, err := s.bulkBatch(ctx, r, page.Rows)
			if err != nil {
				return res, fmt.Errorf("leasing: %s %s (after %d applied): %w", r.Action, s.queue, res.Applied, err)
			}
			res.Matched += len(page.Rows)
			res.Applied += applied
			res.Skipped += len(page.Rows) - applied
			res.Batches++
			if r.Progress != nil {
				r.Progress(res)
			}
			if page.Next.IsZero() {
				break
			}
			req.After = page.Next
		}
	}
	return res, nil
}

// bulkBatch does r.Action to rows and returns how many it acted on: in
// one transaction, but for dead-letter's waiting rows (see
// deadLetterBatch).
func (s *Postgres) bulkBatch(ctx context.Context, r BulkRequest, rows []Row) (int, error) {
	ids := make([]uuid.UUID, 0, len(rows))
	var waiting []uuid.UUID
	for _, row := range rows {
		if r.Action == BulkDeadLetter && row.Status == StatusWaiting {
			waiting = append(waiting, row.ID)
			continue
		}
		ids = append(ids, row.ID)
	}
	slices.SortFunc(ids, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	switch r.Action {
	case BulkRequeue:
		res, err := s.Requeue(ctx, ids...)
		return len(res.Requeued), err
	case BulkDeadLetter:
		applied := 0
		// A waiting message is locked out of message_id order by its key's
		// finisher, who promotes it (partials.sql.tmpl): lock it holding
		// nothing else, one transaction each, as DeadLetterByID does.
		for _, id := range waiting {
			n, err := s.deadLetterBatch(ctx, r, []uuid.UUID{id})
			applied += n
			if err != nil {
				return applied, err
			}
		}
		if len(ids) == 0 {
			return applied, nil
		}
		n, err := s.deadLetterBatch(ctx, r, ids)
		return applied + n, err
	}
	deleted, err := s.purgeIDs(ctx, ids)
	return len(deleted), err
}

// PurgeByID deletes the given messages (1..MaxBatchSize distinct, non-nil
// ids) in one transaction, whatever their status, except those in flight
// (dead-letter those first: DeadLetterByID, with Force for a live lease)
// and those another transaction holds locked (call again).
// A deleted message that held its ordering key frees it and the key's
// next message is promoted. Returns the deleted ids in id order; the
// others are missing from it.
//
// Errors: an *ArgumentError for bad ids.
//
// SQL: db/queries/purge.sql.tmpl (InboxPurgeByIDs).
func (s *Postgres) PurgeByID(ctx context.Context, ids ...uuid.UUID) ([]uuid.UUID, error) {
	if err := validateIDs(ids); err != nil {
		return nil, err
	}
	sorted := slices.Clone(ids)
	slices.SortFunc(sorted, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	deleted, err := s.purgeIDs(ctx, sorted)
	if err != nil {
		return nil, fmt.Errorf("leasing: purge %s by id: %w", s.queue, err)
	}
	return deleted, nil
}

// purgeIDs deletes ids, as PurgeByID, in one transaction.
func (s *Postgres) purgeIDs(ctx context.Context, ids []uuid.UUID) ([]uuid.UUID, error) {
	purge := bind(s.q.purgeByIDs, gen.InboxPurgeByIDsParams{MessageIds: idTexts(ids)})
	vacant := bind(s.q.keyAdvanceVacant, gen.InboxKeyAdvanceVacantParams{Now: s.pinned()})
	if err := s.send(ctx, operator, purge, vacant); err != nil {
		return nil, err
	}
	return purge.out, nil
}

// deadLetterBatch dead-letters ids, sorted and none waiting unless alone,
// as DeadLetterByID does each, in one transaction: the rows are locked in
// message_id order (the lock order), then their keys. Refusals (leased without force, finished since
// the page was read, gone) are skipped, not errors.
func (s *Postgres) deadLetterBatch(ctx context.Context, r BulkRequest, ids []uuid.UUID) (int, error) {
	now := s.pinned()
	dead := make([]*stmt[gen.InboxDeadLetterByIDParams, *gen.InboxDeadLetterByIDRow], len(ids))
	steps := make([]step, 0, len(ids)+2)
	for i, id := range ids {
		dead[i] = bind(s.q.deadLetterByID, gen.InboxDeadLetterByIDParams{
			MessageID: id, Now: now, Reason: SanitizeError(r.Reason), AttemptError: attemptError(r.Reason), Force: r.Force,
		})
		steps = append(steps, dead[i])
	}
	if err := s.send(ctx, operator, append(steps, s.keySteps(ids)...)...); err != nil {
		return 0, err
	}
	applied := 0
	for _, d := range dead {
		if d.out.Outcome == "applied" {
			applied++
		}
	}
	return applied, nil
}

// KeyLines returns up to limit (1..MaxBatchSize) ordering keys in use, the
// key whose head has held it longest first, each with how many messages
// wait behind its head. It reads every key row: for an operator's page.
//
// Errors: an *ArgumentError for a bad limit; a *SchemaError before the
// ordering keys' migration.
//
// SQL: db/queries/keys.sql.tmpl (InboxKeyList).
func (s *Postgres) KeyLines(ctx context.Context, limit int) ([]KeyLine, error) {
	if err := validateCount("key limit", limit); err != nil {
		return nil, err
	}
	keys := bind(s.q.keyList, gen.InboxKeyListParams{MaxRows: int32(limit)})
	if err := s.send(ctx, operator, keys); err != nil {
		return nil, fmt.Errorf("leasing: key lines %s: %w", s.queue, err)
	}
	out := make([]KeyLine, len(keys.out))
	for i, k := range keys.out {
		out[i] = KeyLine{TenantID: k.TenantID, OrderingKey: k.OrderingKey, HeadSince: utc(k.HeadSince), Waiting: k.Waiting}
		if k.HeadID != nil {
			out[i].HeadID = *k.HeadID
		}
	}
	return out, nil
}
