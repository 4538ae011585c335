package leasing

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"
)

// MemoryOptions configures a Memory store.
type MemoryOptions struct {
	// Now is the store's clock, the stand-in for the database clock.
	// Defaults to time.Now. Times are kept to the microsecond, like PostgreSQL.
	Now func() time.Time
	// TracerProvider, when not nil, traces enqueues as
	// PostgresOptions.TracerProvider does: a "send <queue>" span per
	// Enqueue, its trace context stored in the messages' headers. nil, the
	// default, starts no span and adds no header.
	TracerProvider trace.TracerProvider
}

// Memory is an in-process Store with the same semantics as Postgres, for
// unit tests and for callers that want the processor loops without a
// database. It is safe for concurrent use; every method is atomic. A method
// whose context is already done returns ctx.Err() and changes nothing.
//
// Unlike the PostgreSQL schema, Memory accepts legacy in-flight rows with
// no lease expiry (see Load): a claim reclaims such a row once its last
// attempt (or, without one, its creation) is older than the claim's LeaseFor.
type Memory struct {
	queue   Queue
	now     func() time.Time
	tracing tracing

	mu     sync.Mutex
	rows   map[uuid.UUID]*Row
	keys   map[[2]string]*memKey // ordering keys in use, by (tenant, key)
	strict bool                  // SetStrictOrdering
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty in-memory store for queue q.
//
// Errors: an *ArgumentError for an unknown queue.
func NewMemory(q Queue, opts MemoryOptions) (*Memory, error) {
	if _, err := ParseQueue(string(q)); err != nil {
		return nil, err
	}
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	return &Memory{queue: q, now: now, tracing: newTracing(opts.TracerProvider), rows: make(map[uuid.UUID]*Row), keys: make(map[[2]string]*memKey)}, nil
}

// Queue returns the queue this store serves.
func (m *Memory) Queue() Queue { return m.queue }

func (m *Memory) clock() time.Time { return m.now().UTC().Truncate(time.Microsecond) }

// Load stores rows as given, replacing rows with the same ID: for importing
// state and for tests of edge cases the API cannot produce, such as legacy
// in-flight rows without a lease expiry. Rows with an ordering key are
// stored as given: Load keeps no key lines for them.
//
// Errors: an *ArgumentError for a row with an unknown status or a nil ID.
func (m *Memory) Load(rows ...Row) error {
	for _, r := range rows {
		if _, err := m.queue.ParseStatus(string(r.Status)); err != nil {
			return err
		}
		if r.ID == uuid.Nil {
			return argumentError("row", "message id must not be nil")
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range rows {
		r.Attempts = cloneAttempts(r.Attempts)
		m.rows[r.ID] = &r
	}
	return nil
}

// Enqueue implements Store.Enqueue.
//
// Errors: as Postgres; ErrDuplicate on the outbox for an id already present
// (nothing is inserted then).
func (m *Memory) Enqueue(ctx context.Context, msgs ...NewMessage) (res EnqueueResult, err error) {
	msgs, err = validateMessages(m.queue, msgs)
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return EnqueueResult{}, err
	}
	_, span, msgs := m.tracing.send(ctx, m.queue, msgs)
	defer func() { endSend(span, len(res.Duplicates), err) }()
	m.mu.Lock()
	defer m.mu.Unlock()
	inserted := []uuid.UUID{}
	added := map[uuid.UUID]*Row{}
	var order []*Row // added rows in input order
	keys := map[[2]string]*Row{}
	for _, r := range m.rows {
		if r.IdempotencyKey != "" {
			keys[[2]string{r.TenantID, r.IdempotencyKey}] = r
		}
	}
	for _, msg := range msgs {
		// As the SQL: a keyed duplicate of a stored message of another
		// ordering key (or none) fails the call, before anything is inserted.
		if m.queue != Inbox || msg.OrderingKey == "" {
			continue
		}
		if r := m.rows[msg.ID]; r != nil && r.OrderingKey != msg.OrderingKey {
			return EnqueueResult{}, &OrderingKeyConflictError{ID: msg.ID}
		}
		if r := keys[[2]string{msg.TenantID, msg.IdempotencyKey}]; msg.IdempotencyKey != "" && r != nil &&
			r.OrderingKey != msg.OrderingKey {
			return EnqueueResult{}, &OrderingKeyConflictError{ID: msg.ID}
		}
	}
	for _, msg := range msgs {
		if m.rows[msg.ID] != nil || added[msg.ID] != nil {
			if m.queue == Outbox {
				return EnqueueResult{}, fmt.Errorf("%w: outbox message %s", ErrDuplicate, msg.ID)
			}
			continue
		}
		key := [2]string{msg.TenantID, msg.IdempotencyKey}
		if msg.IdempotencyKey != "" && keys[key] != nil {
			continue
		}
		now := m.clock()
		r := &Row{
			Message: Message{
				ID: msg.ID, Type: msg.Type, Payload: msg.Payload, Headers: msg.Headers,
				TenantID: msg.TenantID, IdempotencyKey: msg.IdempotencyKey, Topic: msg.Topic,
				OrderingKey: msg.OrderingKey,
				CreatedAt:   now, VisibleAfter: now.Add(msg.Delay.Truncate(time.Microsecond)),
			},
			Status:   StatusPending,
			Attempts: []Attempt{},
		}
		if msg.IdempotencyKey != "" {
			keys[key] = r
		}
		added[msg.ID] = r
		order = append(order, r)
		inserted = append(inserted, msg.ID)
	}
	now := m.clock()
	for _, r := range order {
		m.rows[r.ID] = r
		if r.OrderingKey != "" {
			m.place(r, now)
		}
	}
	return enqueueResult(msgs, inserted), nil
}

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

// dueAt returns when r, which due reported due, became due: the instant
// from which due holds (Lease.DueAt). The caller holds m.mu.
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
		return (req.TenantID == "" || r.TenantID == req.TenantID) && m.due(r, now, leaseFor)
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
				ClaimedAt: cloneTime(r.LastAttemptedAt), FinishedAt: finished, Outcome: AttemptExpired,
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

// unclaimable returns why a claim cannot lease r, or "": the reasons of the
// claim statement's "unclaimable" in db/queries/queue.sql.tmpl that a Row
// can hold (a time.Time is never infinite), with the same texts. Counters
// are bounded by the column types, integer and bigint.
func unclaimable(r *Row) string {
	switch {
	case r.AttemptCount >= math.MaxInt32:
		return "attempt_count is at its limit (2147483647)"
	case r.LeaseGeneration >= math.MaxInt64:
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

// holds reports whether l is the current lease on r.
func (m *Memory) holds(r *Row, l Lease) bool {
	return r != nil && r.Status == m.queue.InFlight() && r.LeaseOwner == l.Owner && r.LeaseGeneration == l.Generation
}

// Renew implements Store.Renew.
func (m *Memory) Renew(ctx context.Context, leaseFor time.Duration, leases ...Lease) (RenewResult, error) {
	if _, err := validateLeases(m.queue, leases); err != nil {
		return RenewResult{}, err
	}
	if err := validateLeaseFor(leaseFor); err != nil {
		return RenewResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return RenewResult{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	expiry := map[uuid.UUID]time.Time{}
	for _, l := range leases {
		r := m.rows[l.Message.ID]
		if m.holds(r, l) && r.LeaseExpiresAt != nil && r.LeaseExpiresAt.After(now) {
			t := now.Add(leaseFor.Truncate(time.Microsecond))
			r.LeaseExpiresAt = &t
			expiry[l.Message.ID] = t
		}
	}
	return renewResult(leases, expiry), nil
}

// write applies set to every row still held by its lease, appends the
// attempt's entry (outcome, with errText(i) as its error when errText is
// not nil) to its history, and classifies the rest like the SQL statements
// do: already applied when this very lease already wrote this outcome (its
// entry in the history, or done, the check on the columns that rows
// written before the history carry), then terminal, lost, or not found.
// column, when not empty, is recorded in OutcomeGeneration and Outcome.
func (m *Memory) write(leases []Lease, outcome AttemptOutcome, column string, errText func(int) string,
	done func(*Row, Lease) bool, set func(*Row, int, time.Time)) WriteResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	res := WriteResult{Outcomes: make([]MessageOutcome, len(leases))}
	for i, l := range leases {
		r := m.rows[l.Message.ID]
		var o Outcome
		switch {
		case m.holds(r, l):
			a := m.attemptOf(r, outcome, now)
			if errText != nil {
				a.Error = attemptError(errText(i))
			}
			set(r, i, now)
			r.Attempts = appendAttempt(r.Attempts, a)
			m.finishHead(r, now)
			if column != "" {
				r.OutcomeGeneration, r.Outcome = r.LeaseGeneration, column
			}
			o = OutcomeApplied
		case r == nil:
			o = OutcomeNotFound
		case wrote(r.Attempts, l.Owner, l.Generation, outcome) || done(r, l):
			o = OutcomeAlreadyApplied
		case r.Status.Terminal():
			o = OutcomeTerminal
		default:
			o = OutcomeLost
		}
		res.Outcomes[i] = MessageOutcome{MessageID: l.Message.ID, Outcome: o}
	}
	return res
}

// attemptOf returns the history entry of r's current lease ending with
// outcome at now: the lease as it is before the write changes the row.
func (m *Memory) attemptOf(r *Row, outcome AttemptOutcome, now time.Time) Attempt {
	return Attempt{
		Attempt: r.AttemptCount, Generation: r.LeaseGeneration, Owner: r.LeaseOwner,
		ClaimedAt: cloneTime(r.LastAttemptedAt), FinishedAt: now, Outcome: outcome,
	}
}

// wroteAs returns a done check: r is in status s under lease l.
func wroteAs(s Status) func(*Row, Lease) bool {
	return func(r *Row, l Lease) bool {
		return r.Status == s && r.LeaseOwner == l.Owner && r.LeaseGeneration == l.Generation
	}
}

// recorded returns a done check: lease l's generation wrote outcome.
func recorded(outcome string) func(*Row, Lease) bool {
	return func(r *Row, l Lease) bool {
		return r.OutcomeGeneration == l.Generation && r.Outcome == outcome
	}
}

// Release implements Store.Release.
func (m *Memory) Release(ctx context.Context, leases ...Lease) (WriteResult, error) {
	if _, err := validateLeases(m.queue, leases); err != nil {
		return WriteResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return WriteResult{}, err
	}
	return m.write(leases, AttemptReleased, "released", nil, recorded("released"), func(r *Row, _ int, now time.Time) {
		release(r, now)
	}), nil
}

// release gives r's lease back: pending and due at now, lease owner and
// expiry cleared, the attempt the claim counted returned.
func release(r *Row, now time.Time) {
	r.Status, r.VisibleAfter, r.LeaseOwner, r.LeaseExpiresAt = StatusPending, now, "", nil
	r.AttemptCount = max(r.AttemptCount-1, 0)
}

// ReleaseOrphans implements Store.ReleaseOrphans.
func (m *Memory) ReleaseOrphans(ctx context.Context, owner string, held []uuid.UUID) ([]uuid.UUID, error) {
	if err := validateOwner(owner); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	keep := make(map[uuid.UUID]bool, len(held))
	for _, id := range held {
		keep[id] = true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	released := []uuid.UUID{}
	for id, r := range m.rows {
		if r.Status != m.queue.InFlight() || r.LeaseOwner != owner || keep[id] ||
			r.LeaseExpiresAt == nil || !r.LeaseExpiresAt.After(now) {
			continue
		}
		a := m.attemptOf(r, AttemptReleased, now)
		release(r, now)
		r.Attempts = appendAttempt(r.Attempts, a)
		r.OutcomeGeneration, r.Outcome = r.LeaseGeneration, "released"
		released = append(released, id)
	}
	slices.SortFunc(released, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	return released, nil
}

// CompleteAndClaim implements Store.CompleteAndClaim: Complete, then
// Claim, after validating both inputs and checking ctx once.
func (m *Memory) CompleteAndClaim(ctx context.Context, done []Lease, r ClaimRequest) (WriteResult, []Lease, error) {
	if len(done) > 0 {
		if _, err := validateLeases(m.queue, done); err != nil {
			return WriteResult{}, nil, err
		}
	}
	if err := r.Validate(); err != nil {
		return WriteResult{}, nil, err
	}
	if err := ctx.Err(); err != nil {
		return WriteResult{}, nil, err
	}
	// Past this point both halves run: a cancellation must not split them.
	ctx = context.WithoutCancel(ctx)
	res := WriteResult{Outcomes: []MessageOutcome{}}
	if len(done) > 0 {
		res, _ = m.Complete(ctx, done...)
	}
	leases, err := m.Claim(ctx, r) // nil or a *ParkedError
	return res, leases, err
}

// Complete implements Store.Complete.
func (m *Memory) Complete(ctx context.Context, leases ...Lease) (WriteResult, error) {
	if _, err := validateLeases(m.queue, leases); err != nil {
		return WriteResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return WriteResult{}, err
	}
	return m.write(leases, AttemptOutcome(m.queue.Succeeded()), "", nil, wroteAs(m.queue.Succeeded()), func(r *Row, _ int, now time.Time) {
		r.Status, r.FinishedAt, r.LeaseExpiresAt = m.queue.Succeeded(), &now, nil
	}), nil
}

// Fail implements Store.Fail.
func (m *Memory) Fail(ctx context.Context, failures ...Failure) (WriteResult, error) {
	if _, err := validateFailures(m.queue, failures); err != nil {
		return WriteResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return WriteResult{}, err
	}
	errText := func(i int) string { return failures[i].Error }
	return m.write(leasesOf(failures), AttemptFailed, "failed", errText, recorded("failed"), func(r *Row, i int, now time.Time) {
		r.Status, r.LeaseExpiresAt = StatusFailed, nil
		r.VisibleAfter = now.Add(failures[i].RetryAfter.Truncate(time.Microsecond))
		r.LastError = SanitizeError(failures[i].Error)
	}), nil
}

// DeadLetter implements Store.DeadLetter.
func (m *Memory) DeadLetter(ctx context.Context, failures ...Failure) (WriteResult, error) {
	if _, err := validateFailures(m.queue, failures); err != nil {
		return WriteResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return WriteResult{}, err
	}
	errText := func(i int) string { return failures[i].Error }
	return m.write(leasesOf(failures), AttemptDeadLettered, "dead_lettered", errText, recorded("dead_lettered"), func(r *Row, i int, now time.Time) {
		r.Status, r.DeadLetteredAt, r.LeaseExpiresAt = StatusDeadLettered, &now, nil
		r.LastError = SanitizeError(failures[i].Error)
	}), nil
}

// Requeue implements Store.Requeue.
func (m *Memory) Requeue(ctx context.Context, ids ...uuid.UUID) (RequeueResult, error) {
	if err := validateIDs(ids); err != nil {
		return RequeueResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return RequeueResult{}, err
	}
	want := make(map[uuid.UUID]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	return RequeueResult{Requested: len(ids), Requeued: m.requeue(func(id uuid.UUID) bool { return want[id] })}, nil
}

// RequeueAll implements Store.RequeueAll.
func (m *Memory) RequeueAll(ctx context.Context) (RequeueResult, error) {
	if err := ctx.Err(); err != nil {
		return RequeueResult{}, err
	}
	requeued := m.requeue(func(uuid.UUID) bool { return true })
	return RequeueResult{Requested: len(requeued), Requeued: requeued}, nil
}

func (m *Memory) requeue(want func(uuid.UUID) bool) []uuid.UUID {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	requeued := []uuid.UUID{}
	var rejoining []*Row
	for id, r := range m.rows {
		if r.Status != StatusDeadLettered || !want(id) {
			continue
		}
		r.Attempts = appendAttempt(r.Attempts, Attempt{Attempt: r.AttemptCount, FinishedAt: now, Outcome: AttemptRequeued, Operator: true})
		r.Status, r.VisibleAfter, r.AttemptCount = StatusPending, now, 0
		r.LeaseOwner, r.LeaseExpiresAt, r.LastError, r.DeadLetteredAt = "", nil, "", nil
		if r.OrderingKey != "" && !m.holdsKey(r) {
			rejoining = append(rejoining, r)
		}
		requeued = append(requeued, id)
	}
	// Rows that do not hold their key rejoin its line at the tail, in their
	// old order, as the SQL requeue does.
	sortByKeySeq(rejoining)
	for _, r := range rejoining {
		m.place(r, now)
	}
	slices.SortFunc(requeued, func(a, b uuid.UUID) int { return bytes.Compare(a[:], b[:]) })
	return requeued
}

// Purge implements Store.Purge.
func (m *Memory) Purge(ctx context.Context, req PurgeRequest) (int, error) {
	if err := req.validate(); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	cutoff := m.clock().Add(-req.OlderThan.Truncate(time.Microsecond))
	deleted := 0
	var heads []*Row
	for id, r := range m.rows {
		if deleted == req.BatchSize {
			break
		}
		finished := r.Status == m.queue.Succeeded() && r.FinishedAt.Before(cutoff)
		dead := req.IncludeDeadLettered && r.Status == StatusDeadLettered && r.DeadLetteredAt.Before(cutoff)
		if dead && m.holdsKey(r) {
			heads = append(heads, r) // purged below, with its key freed
			continue
		}
		if finished || dead {
			delete(m.rows, id)
			deleted++
		}
	}
	// Dead letters that hold their keys (strict ordering), oldest first, as
	// PurgeHeads: each deletion promotes the key's next message.
	slices.SortFunc(heads, func(a, b *Row) int { return a.DeadLetteredAt.Compare(*b.DeadLetteredAt) })
	now := m.clock()
	for _, r := range heads[:min(len(heads), req.BatchSize-deleted)] {
		delete(m.rows, r.ID)
		m.advance(keyOf(r), now)
	}
	deleted += min(len(heads), req.BatchSize-deleted)
	return deleted, nil
}

// Stats implements Store.Stats.
func (m *Memory) Stats(ctx context.Context) (Stats, error) {
	if err := ctx.Err(); err != nil {
		return Stats{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock()
	st := Stats{Queue: m.queue, Depth: emptyDepth(m.queue)}
	var oldest *time.Time
	for _, r := range m.rows {
		st.Depth[r.Status]++
		expired := r.Status == m.queue.InFlight() && r.LeaseExpiresAt != nil && !r.LeaseExpiresAt.After(now)
		ready := (r.Status == StatusPending || r.Status == StatusFailed) && !r.VisibleAfter.After(now)
		if expired {
			st.ExpiredLeases++
		}
		if (expired || ready) && (oldest == nil || r.CreatedAt.Before(*oldest)) {
			oldest = &r.CreatedAt
		}
	}
	if oldest != nil {
		st.OldestDueAge = now.Sub(*oldest)
	}
	st.WaitingHead = m.waitingHead(now)
	return st, nil
}

// Get implements Store.Get.
func (m *Memory) Get(ctx context.Context, id uuid.UUID) (Row, error) {
	if err := ctx.Err(); err != nil {
		return Row{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.rows[id]
	if r == nil {
		return Row{}, fmt.Errorf("%w: %s message %s", ErrNotFound, m.queue, id)
	}
	return r.clone(), nil
}

// clone returns a copy of r whose history the caller may change.
func (r *Row) clone() Row {
	c := *r
	c.Attempts = cloneAttempts(r.Attempts)
	return c
}

// cloneAttempts copies history, with its times; never nil.
func cloneAttempts(history []Attempt) []Attempt {
	out := make([]Attempt, len(history))
	for i, a := range history {
		a.ClaimedAt = cloneTime(a.ClaimedAt)
		out[i] = a
	}
	return out
}

// Rows returns a copy of every row ordered by (CreatedAt, ID).
func (m *Memory) Rows() []Row {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Row
	for _, r := range m.ordered(func(*Row) bool { return true }) {
		out = append(out, r.clone())
	}
	return out
}
