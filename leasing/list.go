package leasing

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// ListFilter selects messages for Postgres.List, CountMatching and Bulk.
// A zero field matches every message; the fields that are set must all
// match.
type ListFilter struct {
	// Status keeps the messages in this status of the queue.
	Status Status
	// Type keeps the messages of this type (NewMessage.Type).
	Type string
	// TenantID keeps this tenant's messages.
	TenantID string
	// OrderingKey keeps the messages of this ordering key (any tenant
	// unless TenantID is set too).
	OrderingKey string
	// IdempotencyKey keeps the inbox message with this key; the outbox has
	// none (refused).
	IdempotencyKey string
	// Topic keeps the outbox messages of this topic; the inbox has none
	// (refused).
	Topic string
	// ErrorContains keeps the messages whose last error holds this text
	// (case-sensitive).
	ErrorContains string
	// OlderThan keeps the messages created at least this long before the
	// database's now; 0 keeps all ages.
	OlderThan time.Duration
}

// validate checks f for queue q.
func (f ListFilter) validate(q Queue) error {
	if f.Status != "" {
		if _, err := q.ParseStatus(string(f.Status)); err != nil {
			return err
		}
	}
	for _, t := range []struct{ field, value string }{
		{"type", f.Type}, {"tenant id", f.TenantID}, {"ordering key", f.OrderingKey},
		{"idempotency key", f.IdempotencyKey}, {"topic", f.Topic}, {"error text", f.ErrorContains},
	} {
		if !validText(t.value) {
			return argumentError(t.field, "must be UTF-8 without NUL")
		}
	}
	switch {
	case q == Inbox && f.Topic != "":
		return argumentError("topic", "only the outbox has topics")
	case q == Outbox && f.IdempotencyKey != "":
		return argumentError("idempotency key", "only the inbox has idempotency keys")
	case f.OlderThan < 0:
		return argumentError("older than", "must not be negative, got %s", f.OlderThan)
	}
	return nil
}

// Cursor is a place in List's order, (Status, CreatedAt, ID), statuses
// sorted by name: a page
// lists the messages after it. The zero Cursor is the start.
type Cursor struct {
	Status    Status
	CreatedAt time.Time
	ID        uuid.UUID
}

// CursorOf returns the cursor just at r: the next page starts after r.
func CursorOf(r Row) Cursor {
	return Cursor{Status: r.Status, CreatedAt: r.CreatedAt, ID: r.ID}
}

// IsZero reports whether c is the start.
func (c Cursor) IsZero() bool { return c == Cursor{} }

// String encodes c as "<status>.<created_at in Unix microseconds>.<id>",
// which ParseCursor reads; "" for the zero Cursor.
func (c Cursor) String() string {
	if c.IsZero() {
		return ""
	}
	return fmt.Sprintf("%s.%d.%s", c.Status, c.CreatedAt.UnixMicro(), c.ID)
}

// ParseCursor reads a Cursor.String; "" is the zero Cursor.
//
// Errors: an *ArgumentError naming the expected form.
func ParseCursor(s string) (Cursor, error) {
	if s == "" {
		return Cursor{}, nil
	}
	bad := argumentError("cursor", "%q is not a cursor: want <status>.<unix microseconds>.<message id>, as a page's next cursor", s)
	parts := strings.Split(s, ".")
	if len(parts) != 3 || parts[0] == "" {
		return Cursor{}, bad
	}
	micros, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return Cursor{}, bad
	}
	id, err := uuid.Parse(parts[2])
	if err != nil {
		return Cursor{}, bad
	}
	return Cursor{Status: Status(parts[0]), CreatedAt: time.UnixMicro(micros).UTC(), ID: id}, nil
}

// ListRequest asks Postgres.List for one page.
type ListRequest struct {
	// Filter selects the messages.
	Filter ListFilter
	// After is where the page starts (exclusive): the previous page's
	// Next, or the zero Cursor for the first page.
	After Cursor
	// Limit is the most messages the page holds, 1..MaxBatchSize.
	Limit int
}

func (r ListRequest) validate(q Queue) error {
	if err := r.Filter.validate(q); err != nil {
		return err
	}
	if err := validateCount("list limit", r.Limit); err != nil {
		return err
	}
	if !r.After.IsZero() {
		if _, err := q.ParseStatus(string(r.After.Status)); err != nil {
			return argumentError("cursor", "status %q is not a status of the %s queue", r.After.Status, q)
		}
		if r.Filter.Status != "" && r.After.Status != r.Filter.Status {
			return argumentError("cursor", "is in status %s, but the filter keeps %s", r.After.Status, r.Filter.Status)
		}
	}
	return nil
}

// ListPage is one page of Postgres.List.
type ListPage struct {
	// Rows are the messages in (Status, CreatedAt, ID) order, never nil.
	Rows []Row
	// Next is the cursor of the next page, the zero Cursor when this page
	// was the last.
	Next Cursor
}

// DeadLetterGroup is the dead letters that share one last error.
type DeadLetterGroup struct {
	// LastError is the group's last error ("" for none).
	LastError string
	// Messages is how many dead letters hold it.
	Messages int64
	// FirstAt and LastAt are the earliest and latest DeadLetteredAt of
	// the group (database clock, UTC).
	FirstAt, LastAt time.Time
}

// BulkAction is what Postgres.Bulk does to each message a filter matches.
type BulkAction string

const (
	// BulkRequeue requeues the dead letters (Requeue).
	BulkRequeue BulkAction = "requeue"
	// BulkDeadLetter dead-letters the unfinished messages, as
	// DeadLetterByID does (fenced; Force cuts live leases, and the history
	// entry says so).
	BulkDeadLetter BulkAction = "dead-letter"
	// BulkPurge deletes the messages that are not in flight, whatever
	// their status, skipping those locked by others (call again); a
	// deleted key head frees its key for the next message.
	BulkPurge BulkAction = "purge"
)

// ParseBulkAction returns the action named s: requeue, dead-letter or
// purge.
//
// Errors: an *ArgumentError naming the three.
func ParseBulkAction(s string) (BulkAction, error) {
	switch a := BulkAction(s); a {
	case BulkRequeue, BulkDeadLetter, BulkPurge:
		return a, nil
	}
	return "", argumentError("action", "%q is not requeue, dead-letter or purge", s)
}

// BulkRequest asks Postgres.Bulk to act on every message Filter matches.
type BulkRequest struct {
	// Action is what to do.
	Action BulkAction
	// Filter selects the messages. Its Status, when set, must be one the
	// action acts on (see statuses); unset, every such status is read.
	Filter ListFilter
	// Reason is the dead-letter's last error (BulkDeadLetter only, and
	// required there): UTF-8 without NUL, not blank.
	Reason string
	// Force lets BulkDeadLetter cut live leases (recorded as forced in each
	// message's history); without it such messages are skipped.
	Force bool
	// BatchSize is the most messages one transaction acts on,
	// 1..MaxBatchSize.
	BatchSize int
	// Progress, when set, is called after each batch with the totals so
	// far, on the caller's goroutine.
	Progress func(BulkResult)
}

// BulkResult counts what Postgres.Bulk did.
type BulkResult struct {
	// Matched is the messages read that matched the filter.
	Matched int
	// Applied is the messages acted on.
	Applied int
	// Skipped is the matched messages left alone: leased (dead-letter
	// without Force), in flight (purge), or changed before their batch
	// locked them.
	Skipped int
	// Batches is the transactions run.
	Batches int
}

// statuses returns the statuses action a reads on queue q: requeue the
// dead letters, dead-letter the unfinished messages, purge every status
// but the in-flight one.
func (a BulkAction) statuses(q Queue) []Status {
	switch a {
	case BulkRequeue:
		return []Status{StatusDeadLettered}
	case BulkDeadLetter:
		return []Status{StatusWaiting, StatusPending, q.InFlight(), StatusFailed}
	}
	return []Status{StatusWaiting, StatusPending, q.Succeeded(), StatusFailed, StatusDeadLettered}
}

func (r BulkRequest) validate(q Queue) error {
	if _, err := ParseBulkAction(string(r.Action)); err != nil {
		return err
	}
	if err := r.Filter.validate(q); err != nil {
		return err
	}
	if err := validateCount("bulk batch", r.BatchSize); err != nil {
		return err
	}
	if st := r.Filter.Status; st != "" && !slices.Contains(r.Action.statuses(q), st) {
		return argumentError("status", "%s does not act on %s messages", r.Action, st)
	}
	switch {
	case r.Action == BulkDeadLetter:
		return DeadLetterByIDRequest{ID: uuid.Max, Reason: r.Reason}.validate()
	case r.Reason != "":
		return argumentError("reason", "only dead-letter takes a reason")
	case r.Force:
		return argumentError("force", "only dead-letter cuts leases")
	}
	return nil
}

// KeyLine is one ordering key in use and the line behind its head, as
// Postgres.KeyLines returns it.
type KeyLine struct {
	// TenantID ("" for none) and OrderingKey name the key.
	TenantID, OrderingKey string
	// HeadID is the message that holds the key.
	HeadID uuid.UUID
	// HeadSince is when it became the head (database clock, UTC); nil
	// while a finished head's transaction runs.
	HeadSince *time.Time
	// Waiting is how many messages wait behind the head.
	Waiting int64
}
