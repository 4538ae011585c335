package leasing

import (
	"sync"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"
)

// MemoryOptions configures a Memory store.
type MemoryOptions struct {
	// Now is the store's clock, kept to the microsecond. Defaults to
	// time.Now.
	Now func() time.Time
	// TracerProvider traces enqueues as PostgresOptions.TracerProvider
	// does. Defaults to nil: no span, no header.
	TracerProvider trace.TracerProvider
}

// Memory is an in-process Store with the semantics of Postgres, for tests
// and for running the processor without a database. Every method is
// atomic; one whose context is done returns ctx.Err() and changes nothing.
// Unlike the schema, Memory accepts in-flight rows with no lease expiry
// (Load): a claim reclaims one once its last attempt (or creation) is
// older than the claim's LeaseFor.
type Memory struct {
	queue   Queue
	now     func() time.Time
	tracing tracing

	mu     sync.Mutex
	rows   map[uuid.UUID]*Row
	keys   map[[2]string]*memKey // ordering keys in use, by (tenant, key)
	strict bool                  // SetStrictOrdering
	paused map[string]Pause      // Pause, by topic ("" for the whole queue)
	// purgedGeneration is the highest lease generation of a purged row:
	// a new row's generations start there, so that no lease of a purged
	// row passes the fence of a row enqueued again under its id (as the
	// enqueueing transaction's id does on Postgres, migration 00018).
	purgedGeneration int64
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

// Load stores rows as given, replacing rows with the same ID, for states
// the API cannot produce. It places no keyed row in its key's line.
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
