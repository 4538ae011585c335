package leasing

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Queue names one of the two message tables a [Store] serves.
type Queue string

// The queues: messages received, to be handled, and messages to publish.
const (
	Inbox  Queue = "inbox"
	Outbox Queue = "outbox"
)

// ParseQueue returns the Queue named s.
//
// Errors: an *ArgumentError for any other s.
func ParseQueue(s string) (Queue, error) {
	switch q := Queue(s); q {
	case Inbox, Outbox:
		return q, nil
	}
	return "", argumentError("queue", "must be inbox or outbox, got %q", s)
}

// Status is a row's state: processing and completed on the inbox only,
// publishing and published on the outbox only, the others on both.
type Status string

// The status values, spelled as stored.
const (
	StatusPending      Status = "pending"
	StatusProcessing   Status = "processing"
	StatusCompleted    Status = "completed"
	StatusPublishing   Status = "publishing"
	StatusPublished    Status = "published"
	StatusFailed       Status = "failed"
	StatusDeadLettered Status = "dead_lettered"
	// StatusWaiting is a keyed message behind its key's head, promoted to
	// pending when every earlier message of its key has finished.
	StatusWaiting Status = "waiting"
)

// Table returns the table of queue q's rows, e.g. "inbox_messages".
func (q Queue) Table() string { return string(q) + "_messages" }

// KeyTable returns the table of queue q's ordering keys in use, e.g.
// "inbox_ordering_keys".
func (q Queue) KeyTable() string { return string(q) + "_ordering_keys" }

// Channel returns the NOTIFY channel of queue q, its table name, notified
// once per statement that inserts rows.
func (q Queue) Channel() string { return q.Table() }

// InFlight returns the status of a leased row.
func (q Queue) InFlight() Status {
	if q == Outbox {
		return StatusPublishing
	}
	return StatusProcessing
}

// Succeeded returns the status Complete writes.
func (q Queue) Succeeded() Status {
	if q == Outbox {
		return StatusPublished
	}
	return StatusCompleted
}

// Statuses returns the queue's six statuses in lifecycle order.
func (q Queue) Statuses() []Status {
	return []Status{StatusWaiting, StatusPending, q.InFlight(), q.Succeeded(), StatusFailed, StatusDeadLettered}
}

// ParseStatus returns the status named s if it belongs to queue q.
//
// Errors: an *ArgumentError for an unknown status or one of the other queue.
func (q Queue) ParseStatus(s string) (Status, error) {
	for _, st := range q.Statuses() {
		if string(st) == s {
			return st, nil
		}
	}
	return "", argumentError("status", "%q is not a status of the %s queue", s, q)
}

// Terminal reports whether s is a final state (succeeded or dead_lettered).
func (s Status) Terminal() bool {
	return s == StatusCompleted || s == StatusPublished || s == StatusDeadLettered
}

// Message is the content of a queued row, as NewMessage describes it.
// Times are the store's clock.
type Message struct {
	ID       uuid.UUID
	Type     string
	Payload  []byte
	Headers  json.RawMessage // a JSON object; "{}" when none were given
	TenantID string
	// IdempotencyKey is inbox only, Topic outbox only.
	IdempotencyKey string
	Topic          string
	OrderingKey    string
	// CreatedAt is the insert time; claims are FIFO by (CreatedAt, ID).
	CreatedAt time.Time
	// VisibleAfter is when the row may first be claimed.
	VisibleAfter time.Time
}

// Lease is one owner's time-bounded right to work a claimed message. Pass it
// back unchanged to the writes: (Message.ID, Owner, Generation) is the
// fence they check. Times are the store's clock.
//
// A row's generations start above those of every earlier row with the
// same message id (Postgres: at the enqueueing transaction's id, migration
// 00018; Memory: at the highest generation of a purged row), so that a
// lease of a purged row fails the fence of a row enqueued again under its
// id, even when the same owner claimed that row. A row inserted by other
// means with a generation of its own may still meet such a lease: the
// write then applies to the new row and frees the new row's ordering key,
// whatever key the lease names; Postgres does that in a transaction after
// the write's (CompleteTx: in the caller's), and should it fail, the write
// returns an error saying that it committed, which matches none of the
// store's error values (sending the write again frees the key).
type Lease struct {
	Queue Queue
	Owner string
	// Generation is the row's lease_generation after this claim.
	Generation int64
	// ExpiresAt is when the lease ends unless renewed.
	ExpiresAt time.Time
	// Attempt counts this claim: 1 on the first delivery.
	Attempt int
	// LastError is the previous attempt's error text, if any.
	LastError string
	// DueAt is when the row became claimable: the later of CreatedAt and
	// VisibleAfter, or the expired lease's end for a reclaim. The claim's
	// time minus DueAt is the queue lag. Set by claims; writes ignore it.
	DueAt time.Time
	// Message is the row's content.
	Message Message
}

// Row is the full stored state of a message, as Get returns it.
type Row struct {
	Message
	// Status is the row's current state.
	Status Status
	// LeaseOwner is the current lease's owner in flight, else the last
	// writer's after a failed or terminal outcome.
	LeaseOwner string
	// LeaseExpiresAt is set if and only if the row is in flight.
	LeaseExpiresAt *time.Time
	// LeaseGeneration is the fencing token: the row's first (see Lease),
	// then +1 per claim, never reset.
	LeaseGeneration int64
	// LastWriteGeneration is the generation that wrote the latest release,
	// fail or dead-letter (0 if none), and LastWrite what it wrote (the
	// outcome_generation and outcome columns). Attempts
	// decides retried writes; these two serve rows of older versions.
	LastWriteGeneration int64
	LastWrite           string
	// AttemptCount is the number of claims not released.
	AttemptCount    int
	LastAttemptedAt *time.Time
	// LastError is the error of the latest Fail or DeadLetter.
	LastError string
	// FinishedAt is completed_at (inbox) or published_at (outbox).
	FinishedAt *time.Time
	// DeadLetteredAt is set while the row is dead_lettered.
	DeadLetteredAt *time.Time
	// KeySeq is the message's place in its ordering key's line; 0 unordered.
	KeySeq int64
	// Attempts is the history of finished attempts and operator actions,
	// oldest first, at most AttemptHistoryLimit, never nil; the attempt in
	// flight is not in it yet. On PostgreSQL the entry of the attempt that
	// completed (published) the row is not stored: it is read from the
	// row's lease columns, which no statement changes once it is finished.
	Attempts []Attempt
}

// String names the lease for logs: queue, message id, owner and generation.
func (l Lease) String() string {
	return fmt.Sprintf("%s/%s@%s#%d", l.Queue, l.Message.ID, l.Owner, l.Generation)
}
