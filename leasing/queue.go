package leasing

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// Queue names one of the two message tables a [Store] serves.
type Queue string

const (
	// Inbox is the inbox_messages table: messages received, to be handled.
	Inbox Queue = "inbox"
	// Outbox is the outbox_messages table: messages to publish to a broker.
	Outbox Queue = "outbox"
)

// ParseQueue returns the Queue named s ("inbox" or "outbox").
//
// Errors: an *ArgumentError (errors.Is ErrInvalidArgument) for any other s.
func ParseQueue(s string) (Queue, error) {
	switch q := Queue(s); q {
	case Inbox, Outbox:
		return q, nil
	}
	return "", argumentError("queue", "must be inbox or outbox, got %q", s)
}

// Status is a row's state: waiting, pending, failed and dead_lettered on both queues,
// processing/completed on the inbox and publishing/published on the outbox.
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
	// StatusWaiting is a keyed message behind its key's head (see
	// NewMessage.OrderingKey): not claimable until every earlier message of
	// its key has finished, when it is promoted to pending.
	StatusWaiting Status = "waiting"
)

// Table returns the table that holds queue q's rows: "inbox_messages" or
// "outbox_messages".
func (q Queue) Table() string { return string(q) + "_messages" }

// KeyTable returns the table of queue q's ordering keys (migration 00010,
// one row per key in use): "inbox_ordering_keys" or
// "outbox_ordering_keys".
func (q Queue) KeyTable() string { return string(q) + "_ordering_keys" }

// Channel returns the NOTIFY channel of queue q: its table name,
// "inbox_messages" or "outbox_messages". The trigger of migration 00003
// notifies it, without payload, once per statement that inserts rows.
func (q Queue) Channel() string { return q.Table() }

// InFlight returns the status of a leased row: processing for the inbox,
// publishing for the outbox.
func (q Queue) InFlight() Status {
	if q == Outbox {
		return StatusPublishing
	}
	return StatusProcessing
}

// Succeeded returns the status a successful outcome writes: completed for
// the inbox, published for the outbox.
func (q Queue) Succeeded() Status {
	if q == Outbox {
		return StatusPublished
	}
	return StatusCompleted
}

// Statuses returns the queue's six statuses in lifecycle order: waiting,
// pending, in flight, succeeded, failed, dead_lettered.
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
	return "", argumentError("status", "%q is not a %s status", s, q)
}

// Terminal reports whether s is a final state (succeeded or dead_lettered).
func (s Status) Terminal() bool {
	return s == StatusCompleted || s == StatusPublished || s == StatusDeadLettered
}

// Message is the content of a queued row.
type Message struct {
	// ID is the row's message_id.
	ID uuid.UUID
	// Type is the application's message type name; may be empty.
	Type string
	// Payload is the message body, at most MaxPayloadBytes.
	Payload []byte
	// Headers is a JSON object; "{}" when none were given.
	Headers json.RawMessage
	// TenantID is empty when the message belongs to no tenant.
	TenantID string
	// IdempotencyKey is the inbox deduplication key; always empty on the outbox.
	IdempotencyKey string
	// Topic is the outbox destination; always empty on the inbox.
	Topic string
	// OrderingKey is the message's ordering key (NewMessage.OrderingKey);
	// empty for an unordered message.
	OrderingKey string
	// CreatedAt is the store clock at insert; claims are FIFO by (CreatedAt, ID).
	CreatedAt time.Time
	// VisibleAfter is the store time from which the row may be claimed.
	VisibleAfter time.Time
}

// Lease is one owner's time-bounded right to work a claimed message. Pass it
// back unchanged to Renew, Release, Complete, Fail and DeadLetter: the
// (MessageID, Owner, Generation) triple is the fence those writes check.
type Lease struct {
	// Queue is the queue the message was claimed from.
	Queue Queue
	// Owner is the lease owner that claimed it.
	Owner string
	// Generation is the row's lease_generation after this claim.
	Generation int64
	// ExpiresAt is the store time the lease ends unless renewed.
	ExpiresAt time.Time
	// Attempt counts this claim: 1 on the first delivery.
	Attempt int
	// LastError is the error text the previous attempt recorded, if any.
	LastError string
	// DueAt is the store time from which the claim that took this lease
	// could have taken the row: the later of Message.CreatedAt and
	// Message.VisibleAfter for a pending or failed row, the expired lease's
	// end for a reclaimed one (for a legacy in-flight row without an
	// expiry, its last claim or creation plus the claim's lease duration).
	// ExpiresAt - the claim's lease duration - DueAt is how long the
	// message waited for a claim (the processor's queue lag). Set by
	// Claim and Postgres.CompleteAndClaim; writes ignore it.
	DueAt time.Time
	// Message is the row's content.
	Message Message
}

// Row is the full stored state of a message, as Get returns it.
type Row struct {
	Message
	// Status is the row's current state.
	Status Status
	// LeaseOwner is the current lease's owner while in flight, the last
	// writer's owner after a failed or terminal outcome, else empty.
	LeaseOwner string
	// LeaseExpiresAt is set if and only if the row is in flight.
	LeaseExpiresAt *time.Time
	// LeaseGeneration is the fencing token: +1 per claim, never reset.
	LeaseGeneration int64
	// OutcomeGeneration is the generation whose holder wrote the latest
	// release, fail or dead-letter (0 if none), and Outcome what it wrote:
	// "released", "failed" or "dead_lettered". Retried writes are decided
	// from Attempts; these two are still written and read for rows and code
	// of versions before the attempt history (rolling deploys).
	OutcomeGeneration int64
	Outcome           string
	// AttemptCount is the number of attempts so far (claims not released).
	AttemptCount int
	// LastAttemptedAt is the store time of the latest claim.
	LastAttemptedAt *time.Time
	// LastError is the error recorded by the latest Fail or DeadLetter.
	LastError string
	// FinishedAt is completed_at (inbox) or published_at (outbox).
	FinishedAt *time.Time
	// DeadLetteredAt is set while the row is dead_lettered.
	DeadLetteredAt *time.Time
	// KeySeq is the message's place in its ordering key's line (the line
	// is served in KeySeq order); 0 for an unordered message.
	KeySeq int64
	// Attempts is the attempt history: the last AttemptHistoryLimit finished
	// attempts (and operator actions), oldest first, never nil. The attempt
	// in flight, if any, is not in it yet: LeaseOwner, LeaseGeneration and
	// LastAttemptedAt describe it.
	Attempts []Attempt
}

// String names the lease for logs: queue, message id, owner and generation.
func (l Lease) String() string {
	return fmt.Sprintf("%s/%s@%s#%d", l.Queue, l.Message.ID, l.Owner, l.Generation)
}
