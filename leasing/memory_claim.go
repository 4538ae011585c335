package leasing

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"slices"
	"time"
)

// due reports whether r may be claimed at now by a claim leasing for leaseFor.
func (m *Memory) due(r *Row, now time.Time, leaseFor time.Duration) bool {
	switch r.Status {
	case StatusPending, StatusFailed:
		return !r.VisibleAfter.After(now)
	case m.queue.InFlight():
		if r.LeaseExpiresAt != nil {
			return !r.LeaseExpiresAt.After(now)
		}
		since := r.CreatedAt
		if r.LastAttemptedAt != nil {
			since = *r.LastAttemptedAt
		}
		return !since.Add(leaseFor).After(now)
	}
	return false
}

// dueAt returns when the due row r became due (Lease.DueAt).
func (m *Memory) dueAt(r *Row, leaseFor time.Duration) time.Time {
	if r.Status != m.queue.InFlight() {
		if r.VisibleAfter.After(r.CreatedAt) {
			return r.VisibleAfter
		}
		return r.CreatedAt
	}
	if r.LeaseExpiresAt != nil {
		return *r.LeaseExpiresAt
	}
	since := r.CreatedAt
	if r.LastAttemptedAt != nil {
		since = *r.LastAttemptedAt
	}
	return since.Add(leaseFor)
}

// inScope reports whether the claim req may take r by its topic (the
// message type on the inbox): one of req.Topics when it names any, and
// none of req.ExceptTopics.
func (m *Memory) inScope(r *Row, req ClaimRequest) bool {
	topic := m.topic(r)
	return (len(req.Topics) == 0 || slices.Contains(req.Topics, topic)) && !slices.Contains(req.ExceptTopics, topic)
}

// topic returns what claims and pauses call r's topic: its Topic on the
// outbox, its Type on the inbox.
func (m *Memory) topic(r *Row) string {
	if m.queue == Inbox {
		return r.Type
	}
	return r.Topic
}

// ordered returns the rows that keep returns true for, in claim order.
func (m *Memory) ordered(keep func(*Row) bool) []*Row {
	var out []*Row
	for _, r := range m.rows {
		if keep(r) {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b *Row) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return bytes.Compare(a.ID[:], b.ID[:])
	})
	return out
}

// Claim implements Store.Claim.
func (m *Memory) Claim(ctx context.Context, req ClaimRequest) ([]Lease, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	leaseFor := req.LeaseFor.Truncate(time.Microsecond)
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	due := m.ordered(func(r *Row) bool {
		return (req.TenantID == "" || r.TenantID == req.TenantID) && m.inScope(r, req) && !m.isPaused(r) && m.due(r, now, leaseFor)
	})
	leases := []Lease{}
	var parked []ParkedRow
	for _, r := range due[:min(len(due), req.BatchSize)] {
		if reason := unclaimable(r); reason != "" {
			// Parked as the claim statement parks it: dead-lettered, lease
			// fields other than the expiry, generation and attempts kept.
			at := now
			r.Status, r.DeadLetteredAt, r.LeaseExpiresAt = StatusDeadLettered, &at, nil
			r.LastError = "parked by the claim: " + reason
			parked = append(parked, ParkedRow{ID: r.ID, Reason: r.LastError})
			m.finishHead(r, now)
			continue
		}
		dueAt := m.dueAt(r, leaseFor)
		if r.Status == m.queue.InFlight() {
			// A reclaim: the expired attempt's entry, as the SQL claim writes it.
			finished := now
			if r.LeaseExpiresAt != nil {
				finished = *r.LeaseExpiresAt
			}
			r.Attempts = appendAttempt(r.Attempts, Attempt{
				Attempt: r.AttemptCount, Generation: r.LeaseGeneration, Owner: r.LeaseOwner,
				ClaimedAt: cloneTime(r.LastAttemptedAt), FinishedAt: finished, End: AttemptExpired,
			})
		}
		expires := now.Add(leaseFor)
		attempted := now
		r.Status, r.LeaseOwner, r.LeaseExpiresAt = m.queue.InFlight(), req.Owner, &expires
		r.LeaseGeneration++
		r.AttemptCount++
		r.LastAttemptedAt = &attempted
		leases = append(leases, Lease{
			Queue: m.queue, Owner: req.Owner, Generation: r.LeaseGeneration, ExpiresAt: expires,
			Attempt: r.AttemptCount, LastError: r.LastError, DueAt: dueAt, Message: r.Message,
		})
	}
	slices.SortFunc(parked, func(a, b ParkedRow) int { return bytes.Compare(a.ID[:], b.ID[:]) })
	return leases, parkedError(m.queue, parked, nil)
}

// unclaimable returns why a claim cannot lease r, or "": the claim
// statement's reasons (db/queries) that a Row can hold, with its texts.
func unclaimable(r *Row) string {
	switch {
	case r.AttemptCount >= math.MaxInt32:
		return "attempt_count is at its limit (2147483647)"
	case r.LeaseGeneration == math.MaxInt64:
		return "lease_generation is at its limit (9223372036854775807)"
	case len(r.Headers) > 0 && !isJSONObject(r.Headers): // Load may leave them empty: none
		return "headers are a JSON " + jsonType(r.Headers) + ", not an object"
	}
	return ""
}

// jsonType names the JSON type of b as jsonb_typeof does: object, array,
// string, number, boolean or null; "invalid" when b is not JSON.
func jsonType(b []byte) string {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return "invalid"
	}
	switch v.(type) {
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case float64:
		return "number"
	case bool:
		return "boolean"
	}
	return "null"
}
