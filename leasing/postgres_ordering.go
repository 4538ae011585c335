package leasing

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/leasestore/leasestore/gen"
)

// StrictOrdering reports whether strict ordering is on for the store's
// queue (see SetStrictOrdering).
//
// Errors: the driver error.
func (s *Postgres) StrictOrdering(ctx context.Context) (bool, error) {
	strict := bind(gen.New().OrderingStrict, gen.OrderingStrictParams{Queue: string(s.queue)})
	if err := s.send(ctx, operator, strict); err != nil {
		return false, fmt.Errorf("leasing: strict ordering %s: %w", s.queue, err)
	}
	return strict.out, nil
}

// SetStrictOrdering turns strict ordering on or off for the store's queue
// in the database (leasestore_queue_settings), for every process at once:
// on, a head dead-lettered from then on keeps its key blocked until it is
// requeued or purged; off (the default), it frees its key. Turning it off
// also frees the keys that dead-lettered heads hold then, promoting each
// key's next message, in transactions after the one that turns it off:
// one that finds those heads, waiting for the writes still in flight that
// finished a head while strict ordering was on, then one per MaxBatchSize
// keys. Should one fail, the error says so and calling
// SetStrictOrdering(ctx, false) again frees the rest.
//
// Errors: the driver error; ErrLockTimeout when a write in flight held a
// head past the store's LockTimeout.
func (s *Postgres) SetStrictOrdering(ctx context.Context, strict bool) error {
	set := bind(noRows(gen.New().OrderingSetStrict), gen.OrderingSetStrictParams{Queue: string(s.queue), StrictOrdering: strict})
	if err := s.send(ctx, operator, set); err != nil {
		return fmt.Errorf("leasing: set strict ordering %s: %w", s.queue, err)
	}
	if strict {
		return nil
	}
	// After the commit above: a write that read strict ordering on still
	// holds the head it finished, which this waits for.
	heads := bind(s.q.deadLetteredHeads, struct{}{})
	if err := s.send(ctx, operator, heads); err != nil {
		return fmt.Errorf("leasing: set strict ordering %s: find the dead-lettered heads: %w", s.queue, err)
	}
	for ids := heads.out; len(ids) > 0; ids = ids[min(len(ids), MaxBatchSize):] {
		if err := s.send(ctx, operator, s.keySteps(ids[:min(len(ids), MaxBatchSize)])...); err != nil {
			return fmt.Errorf("leasing: set strict ordering %s: free the keys of dead-lettered heads: %w", s.queue, err)
		}
	}
	return nil
}

// keySteps returns the steps that free the keys of the finished heads
// among ids and promote the next message of each: KeyLock, then KeyAdvance
// as a statement of its own, whose snapshot follows the locks
// (db/queries/keys.sql.tmpl). None when ids is empty.
func (s *Postgres) keySteps(ids []uuid.UUID) []step {
	if len(ids) == 0 {
		return nil
	}
	texts := idTexts(ids)
	return []step{
		bind(s.q.keyLock, gen.InboxKeyLockParams{MessageIds: texts}),
		bind(s.q.keyAdvance, gen.InboxKeyAdvanceParams{MessageIds: texts, Now: s.pinned()}),
	}
}

// keyFollowUpTimeout bounds freeParkedKeys and freeUnnamedKeys, which run
// after the call's context may have ended.
const keyFollowUpTimeout = 10 * time.Second

// unnamedKeys returns the ids of the keyed messages that a write of
// leases finished (rows, its outcome rows, which hold every keyed message:
// applied or already applied) although their leases name no ordering key,
// so that the write's key steps (keySteps of keyedIDs(leases)) left their
// keys alone. A lease passes the fence of a row other than its own when
// its row was purged and the id enqueued again, keyed: the new row's lease
// generations start anew, and the same owner name may claim it.
func unnamedKeys(rows []*gen.InboxCompleteRow, leases []Lease) []uuid.UUID {
	if !slices.ContainsFunc(leases, func(l Lease) bool { return l.Message.OrderingKey == "" }) {
		return nil // every lease names a key: the usual keyed batch
	}
	var (
		ids   []uuid.UUID
		named map[uuid.UUID]bool
	)
	for _, r := range rows {
		if !r.Keyed || (r.Outcome != string(OutcomeApplied) && r.Outcome != string(OutcomeAlreadyApplied)) {
			continue
		}
		if named == nil {
			named = make(map[uuid.UUID]bool, len(leases))
			for _, l := range leases {
				named[l.Message.ID] = l.Message.OrderingKey != ""
			}
		}
		if !named[r.MessageID] {
			ids = append(ids, r.MessageID)
		}
	}
	return ids
}

// freeUnnamedKeys frees the keys of the unnamedKeys of a write of leases
// that committed, rows its outcomes, in a transaction after the write's:
// so it runs even when ctx has ended, for at most keyFollowUpTimeout.
// Should it fail, the error says so, and sending the write again (its
// outcomes then already applied) frees them. The error holds the cause's
// text but does not wrap it: the write committed, so it must not match
// ErrLockTimeout or ErrUnavailable, which say that nothing changed or may
// be sent again as the first try.
func (s *Postgres) freeUnnamedKeys(ctx context.Context, rows []*gen.InboxCompleteRow, leases []Lease) error {
	ids := unnamedKeys(rows, leases)
	if len(ids) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), keyFollowUpTimeout)
	defer cancel()
	if err := s.send(ctx, operator, s.keySteps(ids)...); err != nil {
		return fmt.Errorf("leasing: the write on %s committed, but freeing the ordering keys of %d messages whose leases named none failed "+
			"(send the write again to free them): %v", s.queue, len(ids), err)
	}
	return nil
}

// freeParkedKeys frees the keys of rows a claim parked that were their
// keys' heads, in a transaction after the claim's, which committed: so it
// runs even when ctx has ended, for at most keyFollowUpTimeout. Should it
// fail, such a key stays blocked until the parked row is requeued or
// purged (ParkedError.KeysNotFreed).
func (s *Postgres) freeParkedKeys(ctx context.Context, parked []ParkedRow) error {
	if len(parked) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), keyFollowUpTimeout)
	defer cancel()
	ids := make([]uuid.UUID, len(parked))
	for i, p := range parked {
		ids[i] = p.ID
	}
	if err := s.send(ctx, operator, s.keySteps(ids)...); err != nil {
		return fmt.Errorf("leasing: free the keys of the messages the claim of %s parked: %w", s.queue, err)
	}
	return nil
}
