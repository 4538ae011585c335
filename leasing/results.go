package leasing

import (
	"fmt"
	"time"

	"github.com/google/uuid"
)

// enqueueResult reports msgs against the ids the store inserted; stored
// maps the index of each message skipped as a duplicate to the id of the
// stored message it duplicates (missing: uuid.Nil).
func enqueueResult(msgs []NewMessage, inserted []uuid.UUID, stored map[int]uuid.UUID) EnqueueResult {
	res := EnqueueResult{IDs: make([]uuid.UUID, len(msgs)), Duplicates: []Duplicate{}}
	for i, m := range msgs {
		res.IDs[i] = m.ID
	}
	for _, i := range skipped(msgs, inserted) {
		res.Duplicates = append(res.Duplicates, Duplicate{Index: i, ID: stored[i]})
	}
	return res
}

// skipped returns the indexes of the messages of msgs whose ids are not
// among inserted, ascending.
func skipped(msgs []NewMessage, inserted []uuid.UUID) []int {
	done := make(map[uuid.UUID]bool, len(inserted))
	for _, id := range inserted {
		done[id] = true
	}
	var out []int
	for i, m := range msgs {
		if !done[m.ID] {
			out = append(out, i)
		}
	}
	return out
}

// renewResult splits leases into renewed (with new expiry) and lost.
func renewResult(leases []Lease, expiry map[uuid.UUID]time.Time) RenewResult {
	res := RenewResult{Renewed: []Lease{}, Lost: []uuid.UUID{}}
	for _, l := range leases {
		if t, ok := expiry[l.Message.ID]; ok {
			l.ExpiresAt = t
			res.Renewed = append(res.Renewed, l)
		} else {
			res.Lost = append(res.Lost, l.Message.ID)
		}
	}
	return res
}

// EnqueueResult reports an Enqueue call.
type EnqueueResult struct {
	// IDs holds every input message's id, in input order.
	IDs []uuid.UUID
	// Duplicates holds the input messages skipped as already present
	// (inbox only), in input order; never nil.
	Duplicates []Duplicate
}

// Duplicate is an input message that an inbox Enqueue skipped because the
// queue already held it: by its message id, or by its tenant and
// idempotency key.
type Duplicate struct {
	// Index is the message's position in the call's input, from 0.
	Index int
	// ID is the id of the stored message it duplicates, the one Get reads:
	// the message of the input's id when there is one, else the message of
	// the input's tenant and idempotency key (which may have come earlier
	// in the same call). uuid.Nil when that message was purged before the
	// store read its id (Postgres reads it after the INSERT).
	ID uuid.UUID
}

// Outcome says what a guarded write did to one message.
type Outcome string

const (
	// OutcomeApplied: the write changed the row.
	OutcomeApplied Outcome = "applied"
	// OutcomeAlreadyApplied: this lease had already written this outcome
	// (a retry after an unknown commit); nothing changed. The attempt
	// history decides it, for the last AttemptHistoryLimit entries.
	OutcomeAlreadyApplied Outcome = "already_applied"
	// OutcomeTerminal: the row is completed, published or dead-lettered
	// under another lease; nothing changed.
	OutcomeTerminal Outcome = "terminal"
	// OutcomeLost: the lease was reclaimed or released; nothing changed.
	OutcomeLost Outcome = "lost"
	// OutcomeNotFound: no row has this message id.
	OutcomeNotFound Outcome = "not_found"
)

// Succeeded reports whether the row holds the state the write asked for.
func (o Outcome) Succeeded() bool { return o == OutcomeApplied || o == OutcomeAlreadyApplied }

// MessageOutcome is one message's outcome in a WriteResult.
type MessageOutcome struct {
	MessageID uuid.UUID
	Outcome   Outcome
}

// WriteResult reports a guarded batch write.
type WriteResult struct {
	// Outcomes holds one entry per input lease, in input order.
	Outcomes []MessageOutcome
}

// Count returns how many messages ended with outcome o.
func (r WriteResult) Count(o Outcome) int {
	n := 0
	for _, m := range r.Outcomes {
		if m.Outcome == o {
			n++
		}
	}
	return n
}

// Err returns nil when every write succeeded, else an error naming the
// first failed message that matches ErrLeaseLost, ErrAlreadyTerminal or
// ErrNotFound.
func (r WriteResult) Err() error {
	for _, m := range r.Outcomes {
		switch m.Outcome {
		case OutcomeLost:
			return fmt.Errorf("%w: message %s", ErrLeaseLost, m.MessageID)
		case OutcomeTerminal:
			return fmt.Errorf("%w: message %s", ErrAlreadyTerminal, m.MessageID)
		case OutcomeNotFound:
			return fmt.Errorf("%w: message %s", ErrNotFound, m.MessageID)
		}
	}
	return nil
}

// RenewResult reports a Renew call.
type RenewResult struct {
	// Renewed holds the renewed leases with their new ExpiresAt.
	Renewed []Lease
	// Lost holds the ids whose lease was expired, reclaimed, released or
	// finished.
	Lost []uuid.UUID
}

// Err returns nil when every lease was renewed, else ErrLeaseLost naming
// the first lost message.
func (r RenewResult) Err() error {
	if len(r.Lost) > 0 {
		return fmt.Errorf("%w: message %s", ErrLeaseLost, r.Lost[0])
	}
	return nil
}

// RequeueResult reports a Requeue or RequeueAll call.
type RequeueResult struct {
	// Requested is the number of ids asked for (RequeueAll: len(Requeued)).
	Requested int
	// Requeued holds the ids moved back to pending, ordered by id.
	Requeued []uuid.UUID
}

// Stats is a queue's depth and lease health at one instant of the store clock.
type Stats struct {
	Queue Queue
	// Depth holds the number of rows per status, every status of the queue
	// present.
	Depth map[Status]int64
	// ExpiredLeases counts in-flight rows whose lease has expired.
	ExpiredLeases int64
	// OldestDueAge is how long the oldest due row has existed (store now
	// minus its CreatedAt); 0 when nothing is due.
	OldestDueAge time.Duration
	// WaitingHead is the key whose head has held it longest while
	// messages wait behind it; nil when none waits.
	WaitingHead *WaitingHead
}

// OldestHeadAge is WaitingHead.Age, 0 when none waits.
func (s Stats) OldestHeadAge() time.Duration {
	if s.WaitingHead == nil {
		return 0
	}
	return s.WaitingHead.Age
}

func emptyDepth(q Queue) map[Status]int64 {
	depth := make(map[Status]int64, 6)
	for _, s := range q.Statuses() {
		depth[s] = 0
	}
	return depth
}
