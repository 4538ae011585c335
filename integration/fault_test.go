package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
	"github.com/leasestore/leasestore/leasing/processor"
)

// Faults at the store level (deterministic) and at the processor level.
//
// Unknown commit. Two real, deterministic forms:
//   - ReplyLostAfterCommit: the statement reaches the server and commits,
//     and the connection dies before the client reads the reply. A net.Conn
//     wrapper holds back the client's read of the reply until an admin
//     connection sees the committed change, then closes the socket: the
//     call returns a connection error though the write applied. The retry
//     of the same lease must report already_applied (never applied twice,
//     never lost) and change nothing.
//   - KilledBeforeCommit: the statement reaches the server and blocks on a
//     row lock an admin transaction holds; the admin terminates the
//     worker's backend (pg_terminate_backend) while it waits. The call
//     returns an error, nothing changed, and the retry applies.
// A pg_terminate_backend that lands exactly between commit and reply
// cannot be scheduled deterministically from outside; the chaos runs below
// (TerminateBackends, DroppedReplies) produce both cases at random, and the
// stress checks assert the same invariants there.

// dropAfterCommit is a dialer whose connections, once armed, let the next
// statement through and then die before its reply is read.
type dropAfterCommit struct {
	mu      sync.Mutex
	trigger []byte // arm on a write that holds these bytes (a message id)
	wait    func() // blocks until the statement's effect is visible
	fired   atomic.Int32
}

func (d *dropAfterCommit) arm(trigger []byte, wait func()) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.trigger, d.wait = trigger, wait
}

func (d *dropAfterCommit) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &dropAfterCommitConn{Conn: c, d: d}, nil
}

type dropAfterCommitConn struct {
	net.Conn
	d    *dropAfterCommit
	wait func()
}

func (c *dropAfterCommitConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.d.mu.Lock()
	if c.d.trigger != nil && bytes.Contains(b, c.d.trigger) {
		c.wait, c.d.trigger = c.d.wait, nil
	}
	c.d.mu.Unlock()
	return n, err
}

func (c *dropAfterCommitConn) Read(b []byte) (int, error) {
	if c.wait != nil {
		c.wait()
		c.d.fired.Add(1)
		_ = c.Conn.Close()
		return 0, errors.New("fault: connection lost before the reply")
	}
	return c.Conn.Read(b)
}

// rowState reads what the fence and the outcome classification look at.
func rowState(tb testing.TB, admin *pgx.Conn, q leasing.Queue, id uuid.UUID) (status string, gen int64) {
	tb.Helper()
	err := admin.QueryRow(context.Background(), "SELECT status, lease_generation FROM "+tableOf(q)+" WHERE message_id = $1", id).Scan(&status, &gen)
	require.NoError(tb, err)
	return status, gen
}

// waitStatus returns a function that polls until the row has status.
func waitStatus(tb testing.TB, url string, q leasing.Queue, id uuid.UUID, status string) func() {
	return func() {
		conn, err := pgx.Connect(context.Background(), url)
		if err != nil {
			tb.Errorf("wait for commit: %v", err)
			return
		}
		defer conn.Close(context.Background())
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			var got string
			if err := conn.QueryRow(context.Background(), "SELECT status FROM "+tableOf(q)+" WHERE message_id = $1", id).Scan(&got); err == nil && got == status {
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
		tb.Errorf("the statement never committed status %s", status)
	}
}

// faultWrite is one fenced write of a lease, with the status it leaves.
type faultWrite struct {
	name   string
	status func(q leasing.Queue) string
	do     func(ctx context.Context, s leasing.Store, l leasing.Lease) (leasing.WriteResult, error)
}

// faultWrites are the four outcome writes.
var faultWrites = []faultWrite{
	{"Complete", func(q leasing.Queue) string { return string(q.Succeeded()) },
		func(ctx context.Context, s leasing.Store, l leasing.Lease) (leasing.WriteResult, error) {
			return s.Complete(ctx, l)
		}},
	{"Fail", func(leasing.Queue) string { return "failed" },
		func(ctx context.Context, s leasing.Store, l leasing.Lease) (leasing.WriteResult, error) {
			return s.Fail(ctx, leasing.Failure{Lease: l, RetryAfter: time.Hour, Error: "boom"})
		}},
	{"DeadLetter", func(leasing.Queue) string { return "dead_lettered" },
		func(ctx context.Context, s leasing.Store, l leasing.Lease) (leasing.WriteResult, error) {
			return s.DeadLetter(ctx, leasing.Failure{Lease: l, Error: "poison"})
		}},
	{"Release", func(leasing.Queue) string { return "pending" },
		func(ctx context.Context, s leasing.Store, l leasing.Lease) (leasing.WriteResult, error) {
			return s.Release(ctx, l)
		}},
}

func TestFaultUnknownCommit(t *testing.T) {
	t.Parallel()

	t.Run("ReplyLostAfterCommit", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		url := freshURL(t)
		admin := adminConn(t, url)
		dropper := &dropAfterCommit{}
		cfg, err := pgxpool.ParseConfig(url)
		require.NoError(t, err)
		cfg.MaxConns = 1
		cfg.ConnConfig.DialFunc = dropper.dial
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		for _, q := range queuesBoth {
			store, err := leasing.NewPostgres(pool, q, leasing.PostgresOptions{})
			require.NoError(t, err)
			for _, w := range faultWrites {
				_, err := store.Enqueue(ctx, leasing.NewMessage{})
				require.NoError(t, err)
				ls, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 1, LeaseFor: time.Hour})
				require.NoError(t, err)
				require.Len(t, ls, 1)
				l := ls[0]
				dropper.arm(l.Message.ID[:], waitStatus(t, url, q, l.Message.ID, w.status(q)))
				fired := dropper.fired.Load()
				_, err = w.do(ctx, store, l)
				require.Error(t, err, "%s %s: the reply was lost", q, w.name)
				require.False(t, isArgErr(err))
				require.Equal(t, fired+1, dropper.fired.Load(), "%s %s: the fault did not fire", q, w.name)
				status, gen := rowState(t, admin, q, l.Message.ID)
				require.Equal(t, w.status(q), status, "%s %s: the write committed", q, w.name)
				require.Equal(t, l.Generation, gen)

				before := tableDigest(t, admin)
				res, err := w.do(ctx, store, l) // the retry, on a new connection
				require.NoError(t, err, "%s %s retry", q, w.name)
				require.Equal(t, leasing.OutcomeAlreadyApplied, res.Outcomes[0].Outcome, "%s %s retry", q, w.name)
				require.NoError(t, res.Err())
				require.Equal(t, before, tableDigest(t, admin), "%s %s: the retry changed something", q, w.name)
				if w.name == "Release" || w.name == "Fail" {
					// Settle the row so the next claim takes the next message.
					_, err = admin.Exec(ctx, "UPDATE "+tableOf(q)+" SET status = 'dead_lettered', dead_lettered_at = now() WHERE message_id = $1", l.Message.ID)
					require.NoError(t, err)
				}
			}

			// Enqueue: the inbox reports the retried message as a duplicate
			// (it was accepted); the outbox, which does not deduplicate,
			// fails the retry with ErrDuplicate and holds the row once.
			id := uuid.New()
			msg := leasing.NewMessage{ID: id}
			dropper.arm(id[:], waitStatus(t, url, q, id, "pending"))
			_, err = store.Enqueue(ctx, msg)
			require.Error(t, err)
			res, err := store.Enqueue(ctx, msg)
			if q == leasing.Inbox {
				require.NoError(t, err)
				require.Equal(t, []uuid.UUID{id}, res.Duplicates)
			} else {
				require.ErrorIs(t, err, leasing.ErrDuplicate)
			}
			var n int
			require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM "+tableOf(q)+" WHERE message_id = $1", id).Scan(&n))
			require.Equal(t, 1, n)
		}
	})

	t.Run("KilledBeforeCommit", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		url := freshURL(t)
		admin := adminConn(t, url)
		const app = "leasestore-fault-killed"
		pool := newPool(t, url, app, 1)
		for _, q := range queuesBoth {
			store, err := leasing.NewPostgres(pool, q, leasing.PostgresOptions{})
			require.NoError(t, err)
			for _, w := range faultWrites {
				_, err := store.Enqueue(ctx, leasing.NewMessage{})
				require.NoError(t, err)
				ls, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 1, LeaseFor: time.Hour})
				require.NoError(t, err)
				l := ls[0]
				before := tableDigest(t, admin)

				locker := adminConn(t, url)
				tx, err := locker.Begin(ctx)
				require.NoError(t, err)
				_, err = tx.Exec(ctx, "SELECT 1 FROM "+tableOf(q)+" WHERE message_id = $1 FOR UPDATE", l.Message.ID)
				require.NoError(t, err)
				done := make(chan error, 1)
				go func() { _, err := w.do(ctx, store, l); done <- err }()
				waitForLockWait(t, admin, app)
				var killed bool
				require.NoError(t, admin.QueryRow(ctx, `
					SELECT pg_terminate_backend(pid) FROM pg_stat_activity
					WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&killed))
				require.True(t, killed)
				select {
				case err := <-done:
					require.Error(t, err, "%s %s", q, w.name)
					require.True(t, isConnErr(err), "%s %s: %v", q, w.name, err)
				case <-time.After(10 * time.Second):
					t.Fatalf("%s %s: still running after its backend was terminated", q, w.name)
				}
				require.NoError(t, tx.Rollback(ctx))
				require.Equal(t, before, tableDigest(t, admin), "%s %s: a terminated statement changed rows", q, w.name)

				res, err := w.do(ctx, store, l)
				require.NoError(t, err)
				require.Equal(t, leasing.OutcomeApplied, res.Outcomes[0].Outcome, "%s %s retry", q, w.name)
				status, _ := rowState(t, admin, q, l.Message.ID)
				require.Equal(t, w.status(q), status)
				if w.name == "Release" || w.name == "Fail" {
					_, err = admin.Exec(ctx, "UPDATE "+tableOf(q)+" SET status = 'dead_lettered', dead_lettered_at = now() WHERE message_id = $1", l.Message.ID)
					require.NoError(t, err)
				}
			}
		}
	})
}

// TestFaultRetriedWriteAfterReclaim: a Fail (or Release) commits, its reply
// is lost, the message becomes due and another worker claims it; the
// retry of the first write then reports lost although it had applied. The
// issue asks that a retried outcome write never reports a false lease lost.
// The row keeps no trace of which generation wrote failed/pending, so the
// store cannot tell this retry from a write whose lease expired unused.
func TestFaultRetriedWriteAfterReclaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := leasingtest.NewClock(leasingtest.Start)
	url := freshURL(t)
	for _, q := range queuesBoth {
		for _, w := range []string{"Fail", "Release"} {
			store := openStore(t, url, q, leasing.PostgresOptions{Now: clock.Now})
			_, err := store.Enqueue(ctx, leasing.NewMessage{})
			require.NoError(t, err)
			first, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "a", BatchSize: 1, LeaseFor: time.Minute})
			require.NoError(t, err)
			write := func() (leasing.WriteResult, error) {
				if w == "Fail" {
					return store.Fail(ctx, leasing.Failure{Lease: first[0], Error: "boom"})
				}
				return store.Release(ctx, first[0])
			}
			res, err := write() // applies; suppose its reply was lost
			require.NoError(t, err)
			require.Equal(t, leasing.OutcomeApplied, res.Outcomes[0].Outcome)
			second, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "b", BatchSize: 1, LeaseFor: time.Minute})
			require.NoError(t, err)
			require.Len(t, second, 1) // b now works the message
			res, err = write()        // a's retry
			require.NoError(t, err)
			require.NotEqual(t, leasing.OutcomeLost, res.Outcomes[0].Outcome,
				"%s %s: a retried write that had applied reports lost after the message was reclaimed", q, w)
			_, err = store.Complete(ctx, second...)
			require.NoError(t, err)
		}
	}
}

// TestFaultPausedWorker: a worker paused past its lease (a GC pause, a
// stopped VM) and then resuming. Deterministic with a pinned clock.
func TestFaultPausedWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const lease = 30 * time.Second

	setup := func(t *testing.T, q leasing.Queue) (*leasingtest.Clock, *pgx.Conn, leasing.Store, leasing.Store, []leasing.Lease) {
		clock := leasingtest.NewClock(leasingtest.Start)
		url := freshURL(t)
		a := openStore(t, url, q, leasing.PostgresOptions{Now: clock.Now})
		b := openStore(t, url, q, leasing.PostgresOptions{Now: clock.Now})
		_, err := a.Enqueue(ctx, leasing.NewMessage{}, leasing.NewMessage{}, leasing.NewMessage{})
		require.NoError(t, err)
		held, err := a.Claim(ctx, leasing.ClaimRequest{Owner: "paused", BatchSize: 3, LeaseFor: lease})
		require.NoError(t, err)
		require.Len(t, held, 3)
		return clock, adminConn(t, url), a, b, held
	}
	failures := func(ls []leasing.Lease) []leasing.Failure {
		fs := make([]leasing.Failure, len(ls))
		for i, l := range ls {
			fs[i] = leasing.Failure{Lease: l, Error: "late"}
		}
		return fs
	}
	// allWrites runs every write of the paused worker and returns the
	// outcomes of each.
	allWrites := func(t *testing.T, s leasing.Store, held []leasing.Lease) map[string][]leasing.Outcome {
		out := map[string][]leasing.Outcome{}
		renew, err := s.Renew(ctx, lease, held...)
		require.NoError(t, err)
		require.Empty(t, renew.Renewed)
		for _, w := range []struct {
			name string
			do   func() (leasing.WriteResult, error)
		}{
			{"release", func() (leasing.WriteResult, error) { return s.Release(ctx, held...) }},
			{"complete", func() (leasing.WriteResult, error) { return s.Complete(ctx, held...) }},
			{"fail", func() (leasing.WriteResult, error) { return s.Fail(ctx, failures(held)...) }},
			{"dead-letter", func() (leasing.WriteResult, error) { return s.DeadLetter(ctx, failures(held)...) }},
		} {
			res, err := w.do()
			require.NoError(t, err, w.name)
			for _, o := range res.Outcomes {
				out[w.name] = append(out[w.name], o.Outcome)
			}
		}
		return out
	}

	for _, q := range queuesBoth {
		// Reclaimed while paused: every write of the resumed worker is lost
		// and changes nothing; the new owner finishes.
		t.Run(string(q)+"/ReclaimedWhilePaused", func(t *testing.T) {
			t.Parallel()
			clock, admin, a, b, held := setup(t, q)
			clock.Advance(lease)
			current, err := b.Claim(ctx, leasing.ClaimRequest{Owner: "paused", BatchSize: 3, LeaseFor: lease}) // same owner name: only the generation fences
			require.NoError(t, err)
			require.Len(t, current, 3)
			before := tableDigest(t, admin)
			lost := []leasing.Outcome{leasing.OutcomeLost, leasing.OutcomeLost, leasing.OutcomeLost}
			for name, outs := range allWrites(t, a, held) {
				require.Equal(t, lost, outs, name)
			}
			require.Equal(t, before, tableDigest(t, admin))
			res, err := b.Complete(ctx, current...)
			require.NoError(t, err)
			require.Equal(t, 3, res.Count(leasing.OutcomeApplied))
		})
		// Reclaimed and finished while paused: terminal rows say terminal,
		// the failed one (due again later) says lost.
		t.Run(string(q)+"/ReclaimedAndFinishedWhilePaused", func(t *testing.T) {
			t.Parallel()
			clock, admin, a, b, held := setup(t, q)
			clock.Advance(lease + time.Second)
			current, err := b.Claim(ctx, leasing.ClaimRequest{Owner: "b", BatchSize: 3, LeaseFor: lease})
			require.NoError(t, err)
			_, err = b.Complete(ctx, current[0])
			require.NoError(t, err)
			_, err = b.Fail(ctx, leasing.Failure{Lease: current[1], RetryAfter: time.Hour})
			require.NoError(t, err)
			_, err = b.DeadLetter(ctx, leasing.Failure{Lease: current[2]})
			require.NoError(t, err)
			before := tableDigest(t, admin)
			want := []leasing.Outcome{leasing.OutcomeTerminal, leasing.OutcomeLost, leasing.OutcomeTerminal}
			for name, outs := range allWrites(t, a, held) {
				require.Equal(t, want, outs, name)
			}
			require.Equal(t, before, tableDigest(t, admin))
		})
		// Expired but nobody reclaimed yet: renew is refused (the lease
		// expired), but an outcome write still applies: the store fences by
		// generation, not by time (contract Fencing/ExpiredButNotReclaimedMayFinish).
		// A Processor never gets here: it gives a lease up once its local
		// deadline passes (TestFaultPausedProcessor).
		t.Run(string(q)+"/ExpiredNotReclaimed", func(t *testing.T) {
			t.Parallel()
			clock, _, a, _, held := setup(t, q)
			clock.Advance(2 * lease)
			renew, err := a.Renew(ctx, lease, held...)
			require.NoError(t, err)
			require.Len(t, renew.Lost, 3)
			res, err := a.Complete(ctx, held...)
			require.NoError(t, err)
			require.Equal(t, 3, res.Count(leasing.OutcomeApplied))
		})
	}
}

// TestFaultPausedProcessor: a processor whose process freezes (no store
// call gets through, its handler is stuck) for longer than its lease. Another
// processor reclaims and completes the message. When the first resumes and
// its handler returns success, none of its writes may apply.
func TestFaultPausedProcessor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := freshURL(t)
	admin := adminConn(t, url)
	const lease = 400 * time.Millisecond
	rec := newStressRecorder()
	open := func(name string) *recordingStore {
		pg, err := leasing.NewPostgres(newPool(t, url, "", 2), leasing.Inbox, leasing.PostgresOptions{})
		require.NoError(t, err)
		return &recordingStore{Store: pg, rec: rec, worker: name}
	}
	opts := func(name string) processor.Options {
		return processor.Options{Owner: name, BatchSize: 1, Concurrency: 1, LeaseDuration: lease,
			HeartbeatInterval: lease / 4, PollInterval: 20 * time.Millisecond, ShutdownGrace: time.Second}
	}
	res, err := open("loader").Enqueue(ctx, leasing.NewMessage{})
	require.NoError(t, err)
	id := res.IDs[0]

	// The first processor takes the message and freezes inside the handler.
	sa := open("a")
	started, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	pa, err := processor.New(sa, func(context.Context, leasing.Lease) error {
		once.Do(func() { close(started) })
		<-resume // frozen: ignores its context, like a paused process
		return nil
	}, opts("a"))
	require.NoError(t, err)
	go func() { _ = pa.Run(ctx) }()
	<-started
	sa.pause()

	// Its lease expires; a second processor reclaims and completes.
	pb, err := processor.New(open("b"), func(context.Context, leasing.Lease) error { return nil }, opts("b"))
	require.NoError(t, err)
	go func() { _ = pb.Run(ctx) }()
	require.Eventually(t, func() bool {
		status, _ := rowState(t, admin, leasing.Inbox, id)
		return status == "completed"
	}, 10*time.Second, 10*time.Millisecond)
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, pb.Stop(stopCtx))
	before := tableDigest(t, admin)

	// The first resumes: its handler succeeds, its store calls get through.
	sa.resume()
	close(resume)
	require.NoError(t, pa.Stop(stopCtx))
	require.Equal(t, before, tableDigest(t, admin), "the resumed processor changed the row")

	rec.mu.Lock()
	defer rec.mu.Unlock()
	var gens []int64
	for _, c := range rec.claims {
		gens = append(gens, c.gen)
	}
	require.Equal(t, []int64{1, 2}, gens, "a claimed generation 1, b reclaimed as 2")
	for _, w := range rec.writes {
		if w.gen == 1 {
			require.False(t, w.outcome.Succeeded(), "the paused processor's %s applied: %s", w.kind, w.outcome)
		}
	}
	t.Logf("writes of the resumed processor: %d (the processor gave the lease up locally before writing)", countGen(rec.writes, 1))
}

func countGen(ws []writeEvent, gen int64) int {
	n := 0
	for _, w := range ws {
		if w.gen == gen {
			n++
		}
	}
	return n
}

// TestFaultListener: the work signal's connection is broken again and
// again (pg_terminate_backend). Wake-ups resume after each reconnect, a
// message inserted while the listener is down is picked up by the wake the
// listener sends after reconnecting, and a processor whose listener never
// connects still works by polling.
func TestFaultListener(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := freshURL(t)
	admin := adminConn(t, url)
	pool := newPool(t, url, "", 2)
	store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	listener, err := processor.NewListener(pool.Config().ConnConfig, leasing.Inbox, processor.ListenerOptions{MinBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	require.NoError(t, err)
	lctx, stopListener := context.WithCancel(ctx)
	defer stopListener()
	go func() { _ = listener.Run(lctx) }()

	handled := make(chan uuid.UUID, 100)
	proc, err := processor.New(store, func(_ context.Context, l leasing.Lease) error {
		handled <- l.Message.ID
		return nil
	}, processor.Options{PollInterval: time.Hour, WorkSignal: listener}) // only wake-ups can find new rows
	require.NoError(t, err)
	go func() { _ = proc.Run(ctx) }()
	defer func() {
		stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = proc.Stop(stopCtx)
	}()

	expect := func(what string, id uuid.UUID) {
		t.Helper()
		select {
		case got := <-handled:
			require.Equal(t, id, got, what)
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: message not handled within 5s (poll interval is 1h)", what)
		}
	}
	enqueue := func() uuid.UUID {
		res, err := store.Enqueue(ctx, leasing.NewMessage{})
		require.NoError(t, err)
		return res.IDs[0]
	}
	waitPID := func(not uint32) uint32 {
		var pid uint32
		require.Eventually(t, func() bool { pid = listener.BackendPID(); return pid != 0 && pid != not }, 10*time.Second, 5*time.Millisecond)
		return pid
	}
	kill := func(pid uint32) {
		var ok bool
		require.NoError(t, admin.QueryRow(ctx, "SELECT pg_terminate_backend($1)", int32(pid)).Scan(&ok))
		require.True(t, ok)
	}

	pid := waitPID(0)
	expect("before any fault", enqueue())
	for i := range 5 {
		kill(pid)
		if i%2 == 0 {
			// Inserted while the listener may be down: the wake after the
			// reconnect covers it.
			expect("inserted during the outage", enqueue())
			pid = waitPID(pid)
		} else {
			pid = waitPID(pid)
			expect("after a reconnect", enqueue())
		}
	}

	// No working listener at all: polling alone delivers.
	broken := pool.Config().ConnConfig.Copy()
	broken.Port = 1 // nothing listens there
	deaf, err := processor.NewListener(broken, leasing.Outbox, processor.ListenerOptions{MinBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	require.NoError(t, err)
	go func() { _ = deaf.Run(lctx) }()
	outbox, err := leasing.NewPostgres(pool, leasing.Outbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	polled := make(chan struct{}, 10)
	poller, err := processor.New(outbox, func(context.Context, leasing.Lease) error {
		polled <- struct{}{}
		return nil
	}, processor.Options{PollInterval: 100 * time.Millisecond, WorkSignal: deaf})
	require.NoError(t, err)
	go func() { _ = poller.Run(ctx) }()
	defer func() {
		stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = poller.Stop(stopCtx)
	}()
	time.Sleep(150 * time.Millisecond) // let the first (empty) claim pass
	_, err = outbox.Enqueue(ctx, leasing.NewMessage{Topic: "t"})
	require.NoError(t, err)
	select {
	case <-polled:
	case <-time.After(5 * time.Second):
		t.Fatal("polling did not cover a missing work signal")
	}
}

// TestFaultChaos runs the stress harness with faults injected; the stress
// invariants must hold (see stress_test.go).
func TestFaultChaos(t *testing.T) {
	t.Parallel()
	base := stressConfig{
		queue:     leasing.Inbox,
		messages:  pick(800, 20_000),
		workers:   16,
		lease:     300 * time.Millisecond,
		failRate:  0.1,
		slowRate:  0.02,
		crashRate: 0.02,
		timeout:   pick(90*time.Second, 30*time.Minute),
	}
	// pg_terminate_backend of a random worker connection (busy ones
	// first: claims, renews, outcome writes) every ~40ms.
	t.Run("TerminateBackends", func(t *testing.T) {
		t.Parallel()
		cfg := base
		cfg.killEvery = 40 * time.Millisecond
		res := runStress(t, cfg)
		res.report(t)
		require.NotZero(t, len(res.kills), "no backend was terminated")
	})
	// 2% of statements lose their reply after being sent: commits of
	// unknown outcome for claims, renews and outcome writes.
	t.Run("DroppedReplies", func(t *testing.T) {
		t.Parallel()
		cfg := base
		cfg.queue = leasing.Outbox
		cfg.dropReplyRate = 0.02
		res := runStress(t, cfg)
		res.report(t)
		require.NotZero(t, res.dropped, "no reply was dropped")
	})
	// A worker stops reaching the database (a crashed process) every
	// 400ms and is replaced by a fresh one.
	t.Run("WorkerCrashes", func(t *testing.T) {
		t.Parallel()
		cfg := base
		cfg.workerCrashEvery = 400 * time.Millisecond
		res := runStress(t, cfg)
		res.report(t)
		require.NotZero(t, res.workerCrashes)
	})
}

// TestFaultServerRestart restarts the whole PostgreSQL server twice during
// a stress run; the stress invariants must hold. Long form only, and not
// parallel: it breaks every session on the shared server, and Go runs it
// while this binary's parallel tests wait.
func TestFaultServerRestart(t *testing.T) {
	if !long() {
		t.Skip("restarts the shared server: long form only (-stress or LEASESTORE_STRESS=1)")
	}
	t.Cleanup(func() { ensureServerUp(t) })
	res := runStress(t, stressConfig{
		queue:         leasing.Inbox,
		messages:      20_000,
		workers:       16,
		lease:         300 * time.Millisecond,
		failRate:      0.1,
		slowRate:      0.02,
		crashRate:     0.02,
		restartAtDone: []float64{0.2, 0.6},
		timeout:       10 * time.Minute,
	})
	res.report(t)
	require.Equal(t, 2, res.restarts)
}

// phantomClaimStore commits the first claim and then reports that the
// call timed out: the reply arrived after the caller's deadline, as it does
// when a claim statement outlives the processor's claim timeout under load.
type phantomClaimStore struct {
	leasing.Store
	once    sync.Once
	phantom atomic.Int64
}

func (s *phantomClaimStore) Claim(ctx context.Context, r leasing.ClaimRequest) ([]leasing.Lease, error) {
	first := false
	s.once.Do(func() { first = true })
	if !first {
		return s.Store.Claim(ctx, r)
	}
	leases, err := s.Store.Claim(context.WithoutCancel(ctx), r)
	if err != nil {
		return nil, err
	}
	s.phantom.Add(int64(len(leases)))
	return nil, fmt.Errorf("leasing: claim inbox: %w", context.DeadlineExceeded)
}

// TestFaultPhantomClaimBurnsAttempt: a claim that commits after the
// processor gave up on it (its reply was lost) leaves a lease nobody holds.
// Without care the message comes back only once that lease expires, and the
// claim counts an attempt no handler ran: with MaxAttempts 2 and a handler
// that always fails it would be dead-lettered after one handler run. The
// processor's ReleaseOrphans sweep after a failed claim returns the lease and
// its attempt, so attempt counts match handler runs.
func TestFaultPhantomClaimBurnsAttempt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := freshURL(t)
	admin := adminConn(t, url)
	pg, err := leasing.NewPostgres(newPool(t, url, "", 2), leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	res, err := pg.Enqueue(ctx, leasing.NewMessage{})
	require.NoError(t, err)
	store := &phantomClaimStore{Store: pg}
	var runs atomic.Int64
	proc, err := processor.New(store, func(context.Context, leasing.Lease) error {
		runs.Add(1)
		return errors.New("always fails")
	}, processor.Options{
		BatchSize: 1, Concurrency: 1, LeaseDuration: 200 * time.Millisecond, HeartbeatInterval: 50 * time.Millisecond,
		PollInterval: 20 * time.Millisecond, RetryPolicy: processor.RetryPolicy{MaxAttempts: 2, InitialDelay: time.Millisecond},
	})
	require.NoError(t, err)
	go func() { _ = proc.Run(ctx) }()
	require.Eventually(t, func() bool {
		status, _ := rowState(t, admin, leasing.Inbox, res.IDs[0])
		return status == "dead_lettered"
	}, 10*time.Second, 10*time.Millisecond)
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, proc.Stop(stopCtx))
	require.Equal(t, int64(1), store.phantom.Load())
	row, err := pg.Get(ctx, res.IDs[0])
	require.NoError(t, err)
	require.Equal(t, int64(row.AttemptCount), runs.Load(),
		"dead-lettered after %d attempts but the handler ran %d times: a claim the processor never saw counted as an attempt",
		row.AttemptCount, runs.Load())
}

// TestFaultWriteRacesCommittedChange: a fenced write whose statement
// started before another transaction's change to its row committed waits
// for that row's lock and then judges the fence on the row as that change
// left it (the writes check the fence on their locked copy of the row, not
// on the version their snapshot saw). A reclaim by another owner that
// commits meanwhile makes every write report lost and renew renew nothing;
// a change that keeps the lease (a renew's new expiry) lets every write apply.
func TestFaultWriteRacesCommittedChange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := freshURL(t)
	admin := adminConn(t, url)
	const app = "leasestore-fault-race"
	pool := newPool(t, url, app, 1)
	writes := append([]faultWrite{{"Renew", func(q leasing.Queue) string { return string(q.InFlight()) },
		func(ctx context.Context, s leasing.Store, l leasing.Lease) (leasing.WriteResult, error) {
			res, err := s.Renew(ctx, time.Hour, l)
			if err != nil {
				return leasing.WriteResult{}, err
			}
			outcome := leasing.OutcomeLost
			if len(res.Renewed) == 1 {
				outcome = leasing.OutcomeApplied
			}
			return leasing.WriteResult{Outcomes: []leasing.MessageOutcome{{MessageID: l.Message.ID, Outcome: outcome}}}, nil
		}}}, faultWrites...)
	for _, q := range queuesBoth {
		store, err := leasing.NewPostgres(pool, q, leasing.PostgresOptions{})
		require.NoError(t, err)
		for _, w := range writes {
			for _, c := range []struct {
				name   string
				change string // run by the other transaction on the row ($1)
				want   leasing.Outcome
			}{
				{"Reclaimed", "UPDATE " + tableOf(q) + " SET lease_owner = 'other', lease_generation = lease_generation + 1 WHERE message_id = $1", leasing.OutcomeLost},
				{"Renewed", "UPDATE " + tableOf(q) + " SET lease_expires_at = now() + interval '2 hours' WHERE message_id = $1", leasing.OutcomeApplied},
			} {
				msg := leasing.NewMessage{}
				if q == leasing.Outbox {
					msg.Topic = "t"
				}
				_, err := store.Enqueue(ctx, msg)
				require.NoError(t, err)
				ls, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 1, LeaseFor: time.Hour})
				require.NoError(t, err)
				require.Len(t, ls, 1)
				l := ls[0]

				other := adminConn(t, url)
				tx, err := other.Begin(ctx)
				require.NoError(t, err)
				_, err = tx.Exec(ctx, c.change, l.Message.ID)
				require.NoError(t, err)
				done := make(chan error, 1)
				var res leasing.WriteResult
				go func() {
					var err error
					res, err = w.do(ctx, store, l)
					done <- err
				}()
				waitForLockWait(t, admin, app) // its snapshot predates the change
				require.NoError(t, tx.Commit(ctx))
				select {
				case err := <-done:
					require.NoError(t, err, "%s %s %s", q, w.name, c.name)
				case <-time.After(10 * time.Second):
					t.Fatalf("%s %s %s: still waiting after the change committed", q, w.name, c.name)
				}
				require.Len(t, res.Outcomes, 1)
				require.Equal(t, c.want, res.Outcomes[0].Outcome, "%s %s %s", q, w.name, c.name)
				status, gen := rowState(t, admin, q, l.Message.ID)
				if c.want == leasing.OutcomeLost {
					require.Equal(t, string(q.InFlight()), status, "%s %s %s: the other owner's lease must stand", q, w.name, c.name)
					require.Equal(t, l.Generation+1, gen, "%s %s %s", q, w.name, c.name)
				} else {
					require.Equal(t, w.status(q), status, "%s %s %s", q, w.name, c.name)
				}
				// Leave nothing due for the next claim.
				_, err = admin.Exec(ctx, "UPDATE "+tableOf(q)+" SET status = 'dead_lettered', dead_lettered_at = now(), lease_expires_at = NULL WHERE message_id = $1 AND status IN ('pending', 'failed', 'processing', 'publishing')", l.Message.ID)
				require.NoError(t, err)
			}
		}
	}
}
