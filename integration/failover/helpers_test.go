package failover_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/doctor"
	"github.com/leasestore/leasestore/leasing"
)

// queues are both queues, each run by the same drain.
var queues = []leasing.Queue{leasing.Inbox, leasing.Outbox}

// openStores returns a store per queue on a pool of its own at url.
func openStores(t testing.TB, url string) map[leasing.Queue]*leasing.Postgres {
	t.Helper()
	stores := map[leasing.Queue]*leasing.Postgres{}
	for _, q := range queues {
		cfg, err := pgxpool.ParseConfig(url)
		require.NoError(t, err)
		cfg.MaxConns = 4
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		s, err := leasing.NewPostgres(pool, q, leasing.PostgresOptions{})
		require.NoError(t, err)
		stores[q] = s
	}
	return stores
}

// newMessages returns n messages of tenant for q, with ids set.
func newMessages(q leasing.Queue, tenant string, n int) []leasing.NewMessage {
	msgs := make([]leasing.NewMessage, n)
	for i := range msgs {
		msgs[i] = leasing.NewMessage{ID: uuid.New(), Type: "failover", TenantID: tenant}
		if q == leasing.Outbox {
			msgs[i].Topic = "failover"
		}
	}
	return msgs
}

// replicationWarnings runs leasectl doctor's checks on url and returns its
// warnings about replication (docs/high-availability.md).
func replicationWarnings(ctx context.Context, t testing.TB, url string) (doctor.ReplicationReport, []string) {
	t.Helper()
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	rep, err := doctor.Check(ctx, pool, doctor.Options{})
	require.NoError(t, err)
	var out []string
	for _, w := range rep.Warnings {
		if strings.Contains(w, "replication") || strings.Contains(w, "synchronous") {
			out = append(out, w)
		}
	}
	return rep.Replication, out
}

// retryUnavailable calls fn again while it returns ErrUnavailable.
func retryUnavailable(ctx context.Context, fn func() error) error {
	for {
		err := fn()
		if !errors.Is(err, leasing.ErrUnavailable) || ctx.Err() != nil {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rowState is what the promoted primary holds for one message.
type rowState struct {
	status     string
	generation int64
}

// readRows returns every row of q at url by id.
func readRows(ctx context.Context, t testing.TB, url string, q leasing.Queue) map[uuid.UUID]rowState {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(context.WithoutCancel(ctx))
	sql := "SELECT message_id, status::text, lease_generation FROM inbox_messages"
	if q == leasing.Outbox {
		sql = "SELECT message_id, status::text, lease_generation FROM outbox_messages"
	}
	rows, err := conn.Query(ctx, sql)
	require.NoError(t, err)
	out := map[uuid.UUID]rowState{}
	for rows.Next() {
		var id uuid.UUID
		var r rowState
		require.NoError(t, rows.Scan(&id, &r.status, &r.generation))
		out[id] = r
	}
	require.NoError(t, rows.Err())
	return out
}

// ledger records what the clients were told: enqueues and outcome writes
// that returned success, the highest lease generation a client saw per
// message, and how often each message was handled.
type ledger struct {
	mu        sync.Mutex
	acked     map[uuid.UUID]leasing.Queue // enqueue returned success
	completed map[uuid.UUID]int64         // Complete returned applied, with the lease's generation
	seenGen   map[uuid.UUID]int64         // highest generation a claim returned
	handled   map[uuid.UUID]int
	events    []event // successes after the primary stopped, for the recovery figures
	stopped   time.Time
}

// event is one success after the primary stopped.
type event struct {
	what string
	at   time.Time
}

func newLedger() *ledger {
	return &ledger{acked: map[uuid.UUID]leasing.Queue{}, completed: map[uuid.UUID]int64{},
		seenGen: map[uuid.UUID]int64{}, handled: map[uuid.UUID]int{}}
}

func (l *ledger) note(what string) {
	if !l.stopped.IsZero() {
		l.events = append(l.events, event{what: what, at: time.Now()})
	}
}

func (l *ledger) ack(q leasing.Queue, ids []uuid.UUID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		l.acked[id] = q
	}
	l.note("enqueue " + string(q))
}

func (l *ledger) claimed(leases []leasing.Lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ls := range leases {
		l.seenGen[ls.Message.ID] = max(l.seenGen[ls.Message.ID], ls.Generation)
	}
}

func (l *ledger) handle(q leasing.Queue, ls leasing.Lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.handled[ls.Message.ID]++
	l.seenGen[ls.Message.ID] = max(l.seenGen[ls.Message.ID], ls.Generation)
	l.note("handle " + string(q))
}

func (l *ledger) complete(leases []leasing.Lease, res leasing.WriteResult) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, o := range res.Outcomes {
		if o.Outcome == leasing.OutcomeApplied {
			l.completed[o.MessageID] = leases[i].Generation
		}
	}
	l.note("complete inbox")
}

func (l *ledger) markStopped(at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopped = at
}

func (l *ledger) ackedCount(q leasing.Queue) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, aq := range l.acked {
		if aq == q {
			n++
		}
	}
	return n
}

func (l *ledger) handledCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.handled)
}

// recovery returns, per kind of success, how long after the primary
// stopped the first one came.
func (l *ledger) recovery() map[string]time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]time.Duration{}
	for _, e := range l.events {
		if _, ok := out[e.what]; !ok {
			out[e.what] = e.at.Sub(l.stopped)
		}
	}
	return out
}

func formatRecovery(m map[string]time.Duration) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	s := ""
	for _, k := range keys {
		s += fmt.Sprintf(" %s=%s", k, m[k].Round(time.Millisecond))
	}
	return s
}
