package processor_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// signalCounter LISTENs on a queue's channel on a connection of its own
// and counts the payload-less notifications that arrive before a sentinel
// (payload "end"): notifications arrive in commit order, so every
// notification of the inserts committed before the sentinel precedes it.
type signalCounter struct {
	conn    *pgx.Conn
	pool    *pgxpool.Pool
	channel string
}

func newSignalCounter(t *testing.T, url string, pool *pgxpool.Pool, q leasing.Queue) *signalCounter {
	t.Helper()
	conn := adminConn(t, url)
	_, err := conn.Exec(context.Background(), "LISTEN "+pgx.Identifier{q.Channel()}.Sanitize())
	require.NoError(t, err)
	return &signalCounter{conn: conn, pool: pool, channel: q.Channel()}
}

func (c *signalCounter) count(t *testing.T) int {
	t.Helper()
	ctx := context.Background()
	_, err := c.pool.Exec(ctx, "SELECT pg_notify($1, 'end')", c.channel)
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, e2eWait)
	defer cancel()
	n := 0
	for {
		note, err := c.conn.WaitForNotification(wctx)
		require.NoError(t, err, "the sentinel never arrived")
		if note.Payload == "end" {
			return n
		}
		if strings.HasPrefix(note.Payload, "leasestore-listener-probe:") {
			continue // a Listener's check of its own connection
		}
		require.Empty(t, note.Payload, "the work signal carries no payload")
		n++
	}
}

// any reports whether a payload-less notification arrives within wait.
func (c *signalCounter) any(t *testing.T, wait time.Duration) bool {
	t.Helper()
	wctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for {
		note, err := c.conn.WaitForNotification(wctx)
		if err != nil {
			require.ErrorIs(t, wctx.Err(), context.DeadlineExceeded, "listen: %v", err)
			return false
		}
		if note.Payload == "" {
			return true
		}
	}
}

// TestWorkSignalRateLimited: eight producers committing one message per
// transaction get far fewer notifications than commits: the budget of
// migration 00009 (one per 10 ms, bursts of five), and a few more where
// two statements read it at once; and at least one.
func TestWorkSignalRateLimited(t *testing.T) {
	t.Parallel()
	for _, q := range e2eQueues {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			b := e2eSetup(t, q)
			counter := newSignalCounter(t, b.url, b.store.Pool(), q)
			require.Zero(t, counter.count(t))
			const producers, each = 8, 100
			var wg sync.WaitGroup
			start := time.Now()
			for range producers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range each {
						b.enqueueN(t, 1)
					}
				}()
			}
			wg.Wait()
			took := time.Since(start)
			n := counter.count(t)
			budget := int(took/(10*time.Millisecond)) + 5
			t.Logf("%s: %d notifications for %d single-message transactions in %s (budget %d)",
				q, n, producers*each, took.Round(time.Millisecond), budget)
			require.GreaterOrEqual(t, n, 1)
			require.LessOrEqual(t, n, 2*budget+producers, "the signal keeps to its budget, with slack for races")
			require.Less(t, n, producers*each, "the signal does not notify once per transaction")
		})
	}
}

// TestWorkSignalGateSkipsTheFunction: while the budget allows no
// notification, the trigger's WHEN clause (migration 00014) keeps an
// inserting statement from calling the signal function at all; once the
// budget allows one, or the clock stepped back, the next statement calls
// it, and so does every statement of a role that may not read the budget.
// The calls are counted in the transaction itself
// (pg_stat_get_xact_function_calls, with track_functions on for it), so
// other sessions do not disturb the count.
func TestWorkSignalGateSkipsTheFunction(t *testing.T) {
	t.Parallel()
	for _, q := range e2eQueues {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := e2eSetup(t, q)
			applyRoles(t, b.url)
			role := loginRole(t, b.url, "leasestore_processor")
			conn := adminConn(t, b.url)
			tx, err := conn.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, "SET LOCAL track_functions = 'pl'")
			require.NoError(t, err)
			seq := q.Table() + "_work_signal"
			calls := func() int64 {
				t.Helper()
				var n int64
				require.NoError(t, tx.QueryRow(ctx,
					"SELECT coalesce(pg_stat_get_xact_function_calls('leasestore_signal_work()'::regprocedure), 0)").Scan(&n))
				return n
			}
			for i := range 20 {
				// The budget spent: the next notification half a second
				// ahead. Spent anew before each statement, so that a
				// loaded machine's slow round trips do not refill it.
				_, err = tx.Exec(ctx, "SELECT setval($1::regclass, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint + 500000)", seq)
				require.NoError(t, err)
				_, err := b.store.EnqueueTx(ctx, tx, leasing.NewMessage{Payload: fmt.Appendf(nil, `{"n":%d}`, i)})
				require.NoError(t, err)
			}
			require.Zero(t, calls(), "no statement calls the signal function while the budget allows no notification")
			// The budget refilled: the next notification due a second ago.
			_, err = tx.Exec(ctx, "SELECT setval($1::regclass, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint - 1000000)", seq)
			require.NoError(t, err)
			_, err = b.store.EnqueueTx(ctx, tx, leasing.NewMessage{Payload: []byte(`{"n":20}`)})
			require.NoError(t, err)
			require.EqualValues(t, 1, calls(), "a statement the budget allows calls the signal function")
			// The clock stepped back: the next notification more than a
			// second ahead resets the budget.
			_, err = tx.Exec(ctx, "SELECT setval($1::regclass, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint + 2000000)", seq)
			require.NoError(t, err)
			_, err = b.store.EnqueueTx(ctx, tx, leasing.NewMessage{Payload: []byte(`{"n":21}`)})
			require.NoError(t, err)
			require.EqualValues(t, 2, calls(), "a budget more than a second ahead is reset by the function")
			// A role that may not read the sequence still inserts: the clause
			// calls the function, which checks the budget as its owner.
			_, err = tx.Exec(ctx, "SELECT setval($1::regclass, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint + 500000)", seq)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, "REVOKE SELECT ON SEQUENCE "+seq+" FROM PUBLIC, leasestore_processor")
			require.NoError(t, err)
			_, err = tx.Exec(ctx, "SET LOCAL ROLE "+pgx.Identifier{role}.Sanitize())
			require.NoError(t, err)
			_, err = b.store.EnqueueTx(ctx, tx, leasing.NewMessage{Payload: []byte(`{"n":22}`)})
			require.NoError(t, err, "an insert by a role without SELECT on the sequence")
			require.EqualValues(t, 3, calls(), "without the privilege every statement calls the function")
		})
	}
}

// TestWorkSignalLostWithRollbackIsPolled: a transaction spends the
// signal's budget with its inserts (six statements, each notifying) and
// rolls back, so its NOTIFYs are lost; a message committed right after
// (raw SQL, outside the library) finds no budget and gets no notification
// of its own. A Listener-driven processor, idle at its poll ceiling, still
// claims it by polling within the ceiling. The case depends on timing (the
// budget refills by one every 10 ms); the test repeats until it happens
// (one round trip for all the statements).
func TestWorkSignalLostWithRollbackIsPolled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := e2eSetup(t, leasing.Inbox)
	counter := newSignalCounter(t, b.url, b.store.Pool(), leasing.Inbox)
	cfg, err := pgx.ParseConfig(b.url)
	require.NoError(t, err)
	l, err := leasing.NewListener(cfg, leasing.Inbox, leasing.ListenerOptions{})
	require.NoError(t, err)
	lctx, stopListening := context.WithCancel(ctx)
	listened := make(chan error, 1)
	go func() { listened <- l.Run(lctx) }()
	t.Cleanup(func() { stopListening(); require.NoError(t, <-listened) })
	const ceiling = 2 * time.Second
	p := b.start(t, "poll", e2eOK, processor.Options{PollInterval: ceiling, WorkSignal: l})
	b.waitFor(t, func() bool { return l.BackendPID() != 0 }, "listening")

	producer := adminConn(t, b.url)
	require.False(t, counter.any(t, 100*time.Millisecond))
	const rolledBack = `INSERT INTO inbox_messages (message_id, message_type, payload) VALUES (gen_random_uuid(), 'rolled-back', '');`
	for attempt := 1; ; attempt++ {
		require.Less(t, attempt, 50, "never got a commit past the signal's budget")
		id := uuid.New()
		// Simple protocol, one round trip.
		_, err := producer.PgConn().Exec(ctx, "BEGIN;"+strings.Repeat(rolledBack, 6)+"ROLLBACK;"+
			"INSERT INTO inbox_messages (message_id, message_type, payload) VALUES ('"+id.String()+"', 'unsignalled', '');").ReadAll()
		require.NoError(t, err)
		inserted := time.Now()
		// No sentinel here: it would wake the processor. A notification
		// of the commit arrives within milliseconds, if there is one.
		if counter.any(t, 300*time.Millisecond) {
			b.waitStatus(t, id, leasing.StatusCompleted) // signalled: try again,
			time.Sleep(300 * time.Millisecond)           // once the processor is back at its ceiling
			continue
		}
		b.waitStatus(t, id, leasing.StatusCompleted)
		took := time.Since(inserted)
		t.Logf("attempt %d: the unsignalled message was claimed %s after its commit (ceiling %s)", attempt, took.Round(time.Millisecond), ceiling)
		require.Less(t, took, ceiling+5*time.Second, "claimed by the poll, before the ceiling + slack")
		break
	}
	require.NoError(t, p.stop(t))
}

// statementCounter counts the statements sent through a pool, batch
// members one by one: a pgx tracer. As the pool's acquire and release
// tracer it also keeps how many of the pool's connections are in use (an
// acquire that dials included) and when a statement, acquire or release
// last came.
type statementCounter struct {
	n    atomic.Int64
	busy atomic.Int64 // connections acquired, or being acquired, and not released
	last atomic.Int64 // Unix nanoseconds of the last statement, acquire or release
}

func (c *statementCounter) touch() { c.last.Store(time.Now().UnixNano()) }

// idleFor reports whether no connection of the pool is in use and nothing
// was sent, acquired or released for d.
func (c *statementCounter) idleFor(d time.Duration) bool {
	return c.busy.Load() == 0 && time.Since(time.Unix(0, c.last.Load())) >= d
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	c.touch()
	return ctx
}
func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (c *statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}
func (c *statementCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.n.Add(1)
	c.touch()
}
func (c *statementCounter) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
func (c *statementCounter) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	c.busy.Add(1)
	c.touch()
	return ctx
}
func (c *statementCounter) TraceAcquireEnd(_ context.Context, _ *pgxpool.Pool, d pgxpool.TraceAcquireEndData) {
	if d.Err != nil {
		c.busy.Add(-1)
	}
	c.touch()
}
func (c *statementCounter) TraceRelease(*pgxpool.Pool, pgxpool.TraceReleaseData) {
	c.busy.Add(-1)
	c.touch()
}

// TestIdleProcessorIsQuiet counts, with a pgx tracer on the processor's
// pool, the statements an idle processor with a Listener and default
// options sends: after the claims at start, none in a window shorter than
// its poll ceiling (DefaultSignalledPollInterval), and no vacuum-policy
// reads. LEASESTORE_IDLE_WINDOW (a duration) lengthens the window to
// measure statements per minute; the rate is logged.
func TestIdleProcessorIsQuiet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := freshURL(t)
	pcfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	counter := &statementCounter{}
	pcfg.ConnConfig.Tracer = counter
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	l, err := leasing.NewListener(pool.Config().ConnConfig, leasing.Inbox, leasing.ListenerOptions{})
	require.NoError(t, err)
	pctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = l.Run(pctx) }()
	proc, err := processor.New(store, func(context.Context, leasing.Lease) error { return nil }, processor.Options{WorkSignal: l})
	require.NoError(t, err)
	go func() { defer wg.Done(); _ = proc.Run(pctx) }()
	t.Cleanup(func() { stop(); wg.Wait() })

	require.Eventually(t, func() bool { return l.BackendPID() != 0 }, e2eWait, time.Millisecond)
	// The start-up: the privilege check, the claims at start and after the
	// listener's first wake, and their short repolls (126 ms in all); its
	// length depends on the machine's load. It is over once the processor
	// has sent something and then held no pool connection and sent nothing
	// for a second: a statement or a dial that takes long on a loaded
	// machine is not silence (300 ms between statement starts was, and
	// the repolls after it fell into the window). The window then ends
	// about 4 s after the last claim, well before the next poll (10 s).
	connected := counter.n.Load()
	require.Eventually(t, func() bool { return counter.n.Load() > connected && counter.idleFor(time.Second) },
		e2eWait, 10*time.Millisecond, "the processor's start-up settles")
	window := 3 * time.Second
	if v := os.Getenv("LEASESTORE_IDLE_WINDOW"); v != "" {
		window, err = time.ParseDuration(v)
		require.NoError(t, err)
	}
	before := counter.n.Load()
	time.Sleep(window)
	sent := counter.n.Load() - before
	t.Logf("idle processor with a Listener: %d statements in %s, %.1f per minute (the listener's connection included)",
		sent, window, float64(sent)/window.Minutes())
	if window < processor.DefaultSignalledPollInterval-time.Second {
		require.Zero(t, sent, "an idle processor sends nothing within its poll ceiling")
	}
}

// TestWorkSignalOnReleaseAndRequeue: a Release, a Requeue, a
// ReleaseOrphans and an ExpirePrevious make rows due at once and notify
// the work signal, one notification per statement (the budget is read,
// not spent, and nothing else notifies here); a ReleaseAfter with a delay,
// and a ReleaseOrphans that found none, make nothing due and notify
// nothing.
func TestWorkSignalOnReleaseAndRequeue(t *testing.T) {
	t.Parallel()
	for _, q := range e2eQueues {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			b := e2eSetup(t, q)
			ctx := context.Background()
			counter := newSignalCounter(t, b.url, b.store.Pool(), q)
			ids := b.enqueueN(t, 3)
			require.Equal(t, 1, counter.count(t), "the enqueue")
			ls := b.rawClaim(t, "w", 3)
			require.Len(t, ls, 3)

			res, err := b.store.Release(ctx, ls[0])
			require.NoError(t, err)
			require.NoError(t, res.Err())
			require.Equal(t, 1, counter.count(t), "the release")

			res, err = b.store.ReleaseAfter(ctx, leasing.Failure{Lease: ls[1], RetryAfter: time.Minute, Error: "down"})
			require.NoError(t, err)
			require.NoError(t, res.Err())
			require.Zero(t, counter.count(t), "a release due later")

			res, err = b.store.DeadLetter(ctx, leasing.Failure{Lease: ls[2], Error: "poison"})
			require.NoError(t, err)
			require.NoError(t, res.Err())
			require.Zero(t, counter.count(t), "a dead letter")
			rq, err := b.store.Requeue(ctx, ids[2])
			require.NoError(t, err)
			require.Len(t, rq.Requeued, 1)
			require.Equal(t, 1, counter.count(t), "the requeue")

			res, err = b.store.DeadLetter(ctx, leasing.Failure{Lease: b.rawClaim(t, "w", 3)[0], Error: "poison"})
			require.NoError(t, err)
			require.NoError(t, res.Err())
			all, err := b.store.RequeueAll(ctx)
			require.NoError(t, err)
			require.Len(t, all.Requeued, 1)
			require.Equal(t, 1, counter.count(t), "the requeue of all")

			orphan := b.rawClaim(t, "orphans", 3)
			require.Len(t, orphan, 1, "the requeued row")
			released, err := b.store.ReleaseOrphans(ctx, "orphans", nil)
			require.NoError(t, err)
			require.Equal(t, leaseIDs(orphan), released)
			require.Equal(t, 1, counter.count(t), "the release of orphans")
			released, err = b.store.ReleaseOrphans(ctx, "orphans", nil)
			require.NoError(t, err)
			require.Empty(t, released)
			require.Zero(t, counter.count(t), "a release of no orphan")

			label := "instance"
			crashed := leasing.NewOwner(label)
			require.Len(t, b.rawClaim(t, crashed, 3), 1)
			expired, err := b.store.ExpirePrevious(ctx, label, leasing.NewOwner(label))
			require.NoError(t, err)
			require.Len(t, expired, 1)
			require.Equal(t, 1, counter.count(t), "the expiry of a previous incarnation's leases")
		})
	}
}
