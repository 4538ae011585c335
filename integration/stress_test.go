package integration

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	mathrand "math/rand/v2"
	"net"
	"os/exec"
	"sort"
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

// Stress: at least 16 processors, each on its own pool, work one queue of
// messages with real time and short leases (no pinned clock), so that
// leases really expire and are reclaimed. Handlers randomly fail, run longer
// than a lease (the heartbeat must keep them), or crash (hang without
// renewing, so the lease expires and another worker reclaims the message).
// Every handler invocation is recorded and copied into stress_invocations
// (message_id, lease_generation, worker, started_at, finished_at,
// lease_valid_until, result) in the run's own database; every claim, renew
// and outcome write is recorded by a Store wrapper. At the end:
//
//   - every message is in exactly one terminal state (completed/published or
//     dead_lettered): none lost, none pending, failed or in flight; exactly
//     one generation wrote that terminal state, it is the row's final
//     generation and owner, and that generation's handler succeeded (or,
//     for a dead letter, failed on its last attempt);
//   - no write was applied after a newer generation of its message had been
//     claimed, and every write sent after such a reclaim was refused
//     (lost or terminal); refusals are counted;
//   - no two invocations of a message overlapped while both held a valid
//     lease: an invocation of generation g+1 started only after generation
//     g's invocation finished or its lease (last known expiry) ended;
//   - at most one invocation per (message, generation) (the table's key);
//   - attempt_count = lease_generation - applied releases, and every
//     recorded claim's generation is one the row went through.
//
// The fault tests (fault_test.go) run the same harness with connections
// terminated, replies dropped after the statement was sent, whole workers
// crashing, and (long form only) a server restart.
//
// CI: 2,000 messages, 16 workers. Long (make stress, -stress or
// LEASESTORE_STRESS=1): 100,000 messages.

func TestStress(t *testing.T) {
	t.Parallel()
	for _, q := range queuesBoth {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			cfg := stressConfig{
				queue:     q,
				messages:  pick(2_000, 100_000),
				workers:   16,
				lease:     300 * time.Millisecond,
				failRate:  0.15,
				slowRate:  0.02,
				crashRate: 0.02,
				timeout:   pick(60*time.Second, 30*time.Minute),
			}
			if q == leasing.Outbox {
				cfg.messages = pick(1_000, 100_000)
			}
			runStress(t, cfg).report(t)
		})
	}
}

// stressConfig is one stress run.
type stressConfig struct {
	queue    leasing.Queue
	messages int
	workers  int
	// lease is every processor's LeaseDuration; the heartbeat runs every
	// lease/4.
	lease time.Duration
	// Handler behaviour rates, per invocation (decided from a hash of
	// the message id and generation, so reruns of one attempt agree).
	failRate, slowRate, crashRate float64
	maxAttempts                   int // default 4
	// Faults.
	killEvery        time.Duration // pg_terminate_backend of a random worker backend
	dropReplyRate    float64       // per statement: the connection dies after sending it
	workerCrashEvery time.Duration // a whole worker stops talking to the database, then is replaced
	restartAtDone    []float64     // restart the PostgreSQL server when these fractions of the messages are finished, ascending (long form only)
	timeout          time.Duration
}

// invocation is one handler call.
type invocation struct {
	id         uuid.UUID
	gen        int64
	worker     string
	start, end time.Time
	result     string // ok, failed, crashed, cancelled
	attempt    int
}

type claimEvent struct {
	id     uuid.UUID
	gen    int64
	owner  string
	at     time.Time // the claim had committed by then
	expiry time.Time
}

type writeEvent struct {
	id         uuid.UUID
	gen        int64
	owner      string
	kind       string
	outcome    leasing.Outcome // "" when the call failed
	start, end time.Time
}

// stressRecorder collects what every worker saw.
type stressRecorder struct {
	mu          sync.Mutex
	claims      []claimEvent
	writes      []writeEvent
	orphans     map[uuid.UUID]int // rows each ReleaseOrphans reply said it released
	invocations []invocation
	expiry      map[[2]any]time.Time // (id, gen) -> latest known lease expiry
	renewed     int
	renewLost   int
	callErrors  map[string]int
	firstErrors map[string]string
}

func newStressRecorder() *stressRecorder {
	return &stressRecorder{expiry: map[[2]any]time.Time{}, callErrors: map[string]int{}, firstErrors: map[string]string{}}
}

func (r *stressRecorder) callError(op string, err error) {
	r.mu.Lock()
	r.callErrors[op]++
	if _, ok := r.firstErrors[op]; !ok {
		r.firstErrors[op] = err.Error()
	}
	r.mu.Unlock()
}

// recordingStore wraps a worker's store: it records every call and can
// simulate the worker crashing (dead), freezing (paused), or one handler
// crashing (its lease is no longer renewed).
type recordingStore struct {
	leasing.Store
	rec    *stressRecorder
	worker string

	dead    atomic.Bool
	pauseMu sync.Mutex
	paused  chan struct{} // non-nil while paused; closed on resume
	crashed sync.Map      // [2]any{id, gen} -> true: not renewed any more
}

var errWorkerDead = errors.New("stress: worker crashed")

// gate blocks while the store is paused and fails once it is dead.
func (s *recordingStore) gate(ctx context.Context) error {
	s.pauseMu.Lock()
	p := s.paused
	s.pauseMu.Unlock()
	if p != nil {
		select {
		case <-p:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if s.dead.Load() {
		return errWorkerDead
	}
	return nil
}

func (s *recordingStore) pause() {
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	if s.paused == nil {
		s.paused = make(chan struct{})
	}
}

func (s *recordingStore) resume() {
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	if s.paused != nil {
		close(s.paused)
		s.paused = nil
	}
}

func (s *recordingStore) Claim(ctx context.Context, r leasing.ClaimRequest) ([]leasing.Lease, error) {
	if err := s.gate(ctx); err != nil {
		return nil, err
	}
	leases, err := s.Store.Claim(ctx, r)
	at := time.Now()
	if err != nil {
		s.rec.callError("claim", err)
		return leases, err
	}
	s.rec.mu.Lock()
	for _, l := range leases {
		s.rec.claims = append(s.rec.claims, claimEvent{id: l.Message.ID, gen: l.Generation, owner: l.Owner, at: at, expiry: l.ExpiresAt})
		s.rec.expiry[[2]any{l.Message.ID, l.Generation}] = l.ExpiresAt
	}
	s.rec.mu.Unlock()
	return leases, nil
}

func (s *recordingStore) Renew(ctx context.Context, d time.Duration, leases ...leasing.Lease) (leasing.RenewResult, error) {
	if err := s.gate(ctx); err != nil {
		return leasing.RenewResult{}, err
	}
	var keep []leasing.Lease
	for _, l := range leases {
		if _, crashed := s.crashed.Load([2]any{l.Message.ID, l.Generation}); !crashed {
			keep = append(keep, l)
		}
	}
	if len(keep) == 0 {
		return leasing.RenewResult{Renewed: []leasing.Lease{}, Lost: []uuid.UUID{}}, nil
	}
	res, err := s.Store.Renew(ctx, d, keep...)
	if err != nil {
		s.rec.callError("renew", err)
		return res, err
	}
	s.rec.mu.Lock()
	for _, l := range res.Renewed {
		s.rec.expiry[[2]any{l.Message.ID, l.Generation}] = l.ExpiresAt
	}
	s.rec.renewed += len(res.Renewed)
	s.rec.renewLost += len(res.Lost)
	s.rec.mu.Unlock()
	return res, nil
}

func (s *recordingStore) write(ctx context.Context, kind string, leases []leasing.Lease, call func() (leasing.WriteResult, error)) (leasing.WriteResult, error) {
	if err := s.gate(ctx); err != nil {
		return leasing.WriteResult{}, err
	}
	start := time.Now()
	res, err := call()
	end := time.Now()
	if err != nil {
		s.rec.callError(kind, err)
	}
	s.rec.mu.Lock()
	defer s.rec.mu.Unlock()
	for i, l := range leases {
		ev := writeEvent{id: l.Message.ID, gen: l.Generation, owner: l.Owner, kind: kind, start: start, end: end}
		if err == nil {
			ev.outcome = res.Outcomes[i].Outcome
		}
		s.rec.writes = append(s.rec.writes, ev)
	}
	return res, err
}

// ReleaseOrphans records the rows a sweep released: each returns the attempt
// of a claim whose reply never reached its processor.
func (s *recordingStore) ReleaseOrphans(ctx context.Context, owner string, held []uuid.UUID) ([]uuid.UUID, error) {
	if err := s.gate(ctx); err != nil {
		return nil, err
	}
	ids, err := s.Store.ReleaseOrphans(ctx, owner, held)
	if err != nil {
		s.rec.callError("release-orphans", err)
		return ids, err
	}
	s.rec.mu.Lock()
	defer s.rec.mu.Unlock()
	if s.rec.orphans == nil {
		s.rec.orphans = map[uuid.UUID]int{}
	}
	for _, id := range ids {
		s.rec.orphans[id]++
	}
	return ids, nil
}

func (s *recordingStore) Release(ctx context.Context, leases ...leasing.Lease) (leasing.WriteResult, error) {
	return s.write(ctx, "release", leases, func() (leasing.WriteResult, error) { return s.Store.Release(ctx, leases...) })
}

func (s *recordingStore) Complete(ctx context.Context, leases ...leasing.Lease) (leasing.WriteResult, error) {
	return s.write(ctx, "complete", leases, func() (leasing.WriteResult, error) { return s.Store.Complete(ctx, leases...) })
}

func (s *recordingStore) Fail(ctx context.Context, fs ...leasing.Failure) (leasing.WriteResult, error) {
	return s.write(ctx, "fail", failureLeases(fs), func() (leasing.WriteResult, error) { return s.Store.Fail(ctx, fs...) })
}

func (s *recordingStore) DeadLetter(ctx context.Context, fs ...leasing.Failure) (leasing.WriteResult, error) {
	return s.write(ctx, "dead-letter", failureLeases(fs), func() (leasing.WriteResult, error) { return s.Store.DeadLetter(ctx, fs...) })
}

func failureLeases(fs []leasing.Failure) []leasing.Lease {
	out := make([]leasing.Lease, len(fs))
	for i, f := range fs {
		out[i] = f.Lease
	}
	return out
}

// replyDropper makes connections die after a statement was sent and before
// its reply is read: the outcome of that statement is unknown to the
// client. Depending on timing the server has committed it or not.
type replyDropper struct {
	rate    float64
	dropped atomic.Int64
}

func (d *replyDropper) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &droppingConn{Conn: c, d: d}, nil
}

type droppingConn struct {
	net.Conn
	d     *replyDropper
	armed atomic.Bool
}

func (c *droppingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	// 'B' (Bind) or 'Q' (simple query) starts a statement; startup and
	// authentication messages are left alone.
	if err == nil && len(b) > 0 && (b[0] == 'B' || b[0] == 'Q') && mathrand.Float64() < c.d.rate {
		c.armed.Store(true)
	}
	return n, err
}

func (c *droppingConn) Read(b []byte) (int, error) {
	if c.armed.Load() {
		time.Sleep(time.Duration(mathrand.IntN(3)) * time.Millisecond) // sometimes the server has committed
		c.d.dropped.Add(1)
		_ = c.Conn.Close()
		return 0, errors.New("fault: connection lost after the statement was sent")
	}
	return c.Conn.Read(b)
}

// stressResult is what a run counted.
type stressResult struct {
	cfg                  stressConfig
	elapsed              time.Duration
	completed, dead      int
	invocations          int
	byResult             map[string]int
	claims, reclaims     int
	phantomClaims        int // claims that committed but whose reply never arrived
	refused              map[string]int
	writesAfterReclaim   int
	unknownWrites        int // write calls that returned an error
	alreadyApplied       int
	renewed, renewLost   int
	kills                map[string]int
	dropped              int64
	workerCrashes        int
	restarts             int
	processorErrors      int64
	unstartedClaims      int
	maxAttemptsSeen      int
	callErrors           map[string]int
	firstErrors          map[string]string
	invocationsPerMsgMax int
	// deadEarly counts dead letters whose handler ran fewer than
	// maxAttempts times: attempts spent by claims it never saw.
	deadEarly int
	// exhausted counts messages dead-lettered without running the handler:
	// claimed past maxAttempts after attempts that ended without an outcome.
	exhausted int
}

func (r stressResult) report(t *testing.T) {
	t.Logf("stress %s: %d messages, %d workers, lease %s, in %s (%.0f msg/s)",
		r.cfg.queue, r.cfg.messages, r.cfg.workers, r.cfg.lease, r.elapsed.Round(time.Millisecond), float64(r.cfg.messages)/r.elapsed.Seconds())
	t.Logf("  terminal: %d succeeded, %d dead-lettered, 0 lost, 0 in flight", r.completed, r.dead)
	t.Logf("  invocations: %d %v (max %d per message); claims %d (%d reclaims of an expired or lost lease, %d phantom: committed, reply lost; %d never started)",
		r.invocations, r.byResult, r.invocationsPerMsgMax, r.claims, r.reclaims, r.phantomClaims, r.unstartedClaims)
	t.Logf("  renews: %d renewed, %d lost; writes refused by the fence: %v; writes sent after a reclaim: %d (all refused); write calls with unknown outcome: %d; already_applied: %d",
		r.renewed, r.renewLost, r.refused, r.writesAfterReclaim, r.unknownWrites, r.alreadyApplied)
	t.Logf("  faults: backends terminated %v, replies dropped %d, worker crashes %d, server restarts %d; store call errors %v; processor OnError %d",
		r.kills, r.dropped, r.workerCrashes, r.restarts, r.callErrors, r.processorErrors)
	t.Logf("  dead letters with fewer than %d handler runs (attempts burnt by claims whose reply never arrived): %d; dead-lettered as exhausted without a last run: %d", r.cfg.maxAttempts, r.deadEarly, r.exhausted)
	for op, e := range r.firstErrors {
		t.Logf("  first %s error: %.200s", op, e)
	}
}

// stressWorker is one running processor.
type stressWorker struct {
	name  string
	store *recordingStore
	pool  *pgxpool.Pool
	proc  *processor.Processor
	done  chan struct{}
}

// stressSlot lets one stress run at a time use the shared server: a run
// holds about 16 workers x 2 connections, and max_connections is 100.
var stressSlot = make(chan struct{}, 1)

func runStress(t *testing.T, cfg stressConfig) stressResult {
	t.Helper()
	stressSlot <- struct{}{}
	defer func() { <-stressSlot }()
	if cfg.maxAttempts == 0 {
		cfg.maxAttempts = 4
	}
	ctx := context.Background()
	url := freshURL(t)
	admin := adminConn(t, url)
	_, err := admin.Exec(ctx, `CREATE TABLE stress_invocations (
		message_id        uuid        NOT NULL,
		lease_generation  bigint      NOT NULL,
		worker            text        NOT NULL,
		started_at        timestamptz NOT NULL,
		finished_at       timestamptz NOT NULL,
		lease_valid_until timestamptz NOT NULL,
		result            text        NOT NULL,
		attempt           integer     NOT NULL,
		PRIMARY KEY (message_id, lease_generation))`)
	require.NoError(t, err)

	// Messages, via COPY in chunks.
	loader, err := leasing.NewPostgres(newPool(t, url, "", 2), cfg.queue, leasing.PostgresOptions{})
	require.NoError(t, err)
	ids := make([]uuid.UUID, 0, cfg.messages)
	for len(ids) < cfg.messages {
		n := min(cfg.messages-len(ids), leasing.MaxBatchSize)
		msgs := make([]leasing.NewMessage, n)
		for i := range msgs {
			msgs[i].Payload = []byte("stress")
			if cfg.queue == leasing.Outbox {
				msgs[i].Topic = "stress"
			}
		}
		var got []uuid.UUID
		err := pgx.BeginFunc(ctx, loader.Pool(), func(tx pgx.Tx) (err error) { got, err = loader.EnqueueCopy(ctx, tx, msgs...); return err })
		require.NoError(t, err)
		ids = append(ids, got...)
	}

	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	app := "lst-" + hex.EncodeToString(suffix[:]) // this run's backends, for the killer
	rec := newStressRecorder()
	dropper := &replyDropper{rate: cfg.dropReplyRate}
	var processorErrors atomic.Int64
	seed := binary.BigEndian.Uint64(append(suffix[:], 0, 0, 0, 0))

	handler := func(rs *recordingStore) processor.Handler {
		return func(hctx context.Context, l leasing.Lease) error {
			inv := invocation{id: l.Message.ID, gen: l.Generation, worker: rs.worker, start: time.Now(), attempt: l.Attempt}
			defer func() {
				inv.end = time.Now()
				rec.mu.Lock()
				rec.invocations = append(rec.invocations, inv)
				rec.mu.Unlock()
			}()
			h := fnv.New64a()
			_, _ = h.Write(l.Message.ID[:])
			_ = binary.Write(h, binary.BigEndian, l.Generation)
			_ = binary.Write(h, binary.BigEndian, seed)
			u := float64(h.Sum64()%1_000_000) / 1_000_000
			wait := func(d time.Duration) bool {
				select {
				case <-time.After(d):
					return true
				case <-hctx.Done():
					return false
				}
			}
			switch {
			case u < cfg.crashRate:
				// The handler hangs and its lease is no longer renewed, as
				// if its process had died: only the lease's expiry frees it.
				rs.crashed.Store([2]any{l.Message.ID, l.Generation}, true)
				<-hctx.Done()
				inv.result = "crashed"
				return context.Cause(hctx)
			case u < cfg.crashRate+cfg.slowRate:
				if !wait(cfg.lease * 3 / 2) { // longer than a lease: the heartbeat must hold it
					inv.result = "cancelled"
					return context.Cause(hctx)
				}
			case u < cfg.crashRate+cfg.slowRate+cfg.failRate:
				wait(time.Duration(mathrand.IntN(2)) * time.Millisecond)
				inv.result = "failed"
				return errors.New("stress: handler failed\x00 \xff")
			default:
				if !wait(time.Duration(mathrand.IntN(3)) * time.Millisecond) {
					inv.result = "cancelled"
					return context.Cause(hctx)
				}
			}
			inv.result = "ok"
			return nil
		}
	}

	var (
		workersMu sync.Mutex
		workers   = map[string]*stressWorker{}
		serial    int
	)
	start := func() *stressWorker {
		workersMu.Lock()
		serial++
		name := fmt.Sprintf("w%02d", serial)
		workersMu.Unlock()
		pcfg, err := pgxpool.ParseConfig(url)
		require.NoError(t, err)
		pcfg.MaxConns = 2
		pcfg.ConnConfig.RuntimeParams["application_name"] = app
		if cfg.dropReplyRate > 0 {
			pcfg.ConnConfig.DialFunc = dropper.dial
		}
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		pg, err := leasing.NewPostgres(pool, cfg.queue, leasing.PostgresOptions{})
		require.NoError(t, err)
		rs := &recordingStore{Store: pg, rec: rec, worker: name}
		proc, err := processor.New(rs, handler(rs), processor.Options{
			Owner:             name,
			BatchSize:         8,
			LeaseDuration:     cfg.lease,
			HeartbeatInterval: cfg.lease / 4,
			Concurrency:       4,
			PollInterval:      50 * time.Millisecond,
			RetryPolicy:       processor.RetryPolicy{MaxAttempts: cfg.maxAttempts, InitialDelay: 5 * time.Millisecond, MaxDelay: 20 * time.Millisecond},
			ShutdownGrace:     cfg.lease,
			OnError:           func(error) { processorErrors.Add(1) },
		})
		require.NoError(t, err)
		w := &stressWorker{name: name, store: rs, pool: pool, proc: proc, done: make(chan struct{})}
		workersMu.Lock()
		workers[name] = w
		workersMu.Unlock()
		go func() {
			defer close(w.done)
			_ = proc.Run(context.Background())
		}()
		return w
	}

	began := time.Now()
	for range cfg.workers {
		start()
	}

	// Faults.
	faultCtx, stopFaults := context.WithCancel(ctx)
	var faults sync.WaitGroup
	kills := map[string]int{}
	var killsMu sync.Mutex
	if cfg.killEvery > 0 {
		faults.Add(1)
		go func() {
			defer faults.Done()
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				t.Errorf("killer: %v", err)
				return
			}
			defer conn.Close(context.Background())
			for faultCtx.Err() == nil {
				time.Sleep(time.Duration(float64(cfg.killEvery) * (0.5 + mathrand.Float64())))
				rows, err := conn.Query(ctx, `
					SELECT coalesce(substring(query FROM '-- name: (\w+)'), state), pg_terminate_backend(pid)
					FROM pg_stat_activity
					WHERE application_name = $1 AND datname = current_database()
					ORDER BY (state = 'active') DESC, random()
					LIMIT 1`, app)
				if err != nil {
					if faultCtx.Err() == nil && !isConnErr(err) {
						t.Errorf("killer: %v", err)
					}
					conn.Close(context.Background())
					conn, err = reconnect(faultCtx, url)
					if err != nil {
						return
					}
					continue
				}
				for rows.Next() {
					var what string
					var ok bool
					if rows.Scan(&what, &ok) == nil && ok {
						killsMu.Lock()
						kills[what]++
						killsMu.Unlock()
					}
				}
				rows.Close()
			}
		}()
	}
	var workerCrashes atomic.Int64
	if cfg.workerCrashEvery > 0 {
		faults.Add(1)
		go func() {
			defer faults.Done()
			for faultCtx.Err() == nil {
				time.Sleep(cfg.workerCrashEvery)
				if faultCtx.Err() != nil {
					return
				}
				workersMu.Lock()
				var victim *stressWorker
				for _, w := range workers {
					if !w.store.dead.Load() {
						victim = w
						break
					}
				}
				workersMu.Unlock()
				if victim == nil {
					continue
				}
				victim.store.dead.Store(true) // it can no longer reach the database
				workerCrashes.Add(1)
				start() // a replacement
				go func() {
					stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					_ = victim.proc.Stop(stopCtx)
					victim.pool.Close() // its connections are gone with it
				}()
			}
		}()
	}
	// Wait until no message is active, restarting the server as the
	// finished messages pass cfg.restartAtDone (by progress, not by the
	// clock, so that both restarts fall inside the run on a fast machine
	// and a slow one).
	var restarts int
	deadline := began.Add(cfg.timeout)
	var active int64
	for {
		err := admin.QueryRow(ctx, "SELECT count(*) FROM "+tableOf(cfg.queue)+
			" WHERE status NOT IN ('completed', 'published', 'dead_lettered')").Scan(&active)
		if err != nil && isConnErr(err) { // the server restarted
			admin.Close(ctx)
			admin, err = reconnect(ctx, url)
			require.NoError(t, err)
			t.Cleanup(func() { _ = admin.Close(context.Background()) })
			continue
		}
		require.NoError(t, err)
		if active == 0 || time.Now().After(deadline) {
			break
		}
		if restarts < len(cfg.restartAtDone) && float64(int64(cfg.messages)-active) >= cfg.restartAtDone[restarts]*float64(cfg.messages) {
			restartServer(t)
			restarts++
			continue
		}
		time.Sleep(100 * time.Millisecond)
	}
	elapsed := time.Since(began)
	stopFaults()
	faults.Wait()
	workersMu.Lock()
	all := make([]*stressWorker, 0, len(workers))
	for _, w := range workers {
		all = append(all, w)
	}
	workersMu.Unlock()
	var stopWG sync.WaitGroup
	for _, w := range all {
		stopWG.Add(1)
		go func() {
			defer stopWG.Done()
			stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := w.proc.Stop(stopCtx); err != nil {
				t.Errorf("worker %s did not stop: %v", w.name, err)
			}
		}()
	}
	stopWG.Wait()
	require.Zero(t, active, "messages still active after %s", cfg.timeout)

	res := checkStress(t, cfg, admin, ids, rec, clockSkew(t, admin))
	res.elapsed = elapsed
	res.kills = kills
	res.dropped = dropper.dropped.Load()
	res.workerCrashes = int(workerCrashes.Load())
	res.restarts = restarts
	res.processorErrors = processorErrors.Load()
	return res
}

// checkStress checks the invariants listed at the top of this file.
func checkStress(t *testing.T, cfg stressConfig, admin *pgx.Conn, ids []uuid.UUID, rec *stressRecorder, skew time.Duration) stressResult {
	t.Helper()
	ctx := context.Background()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	res := stressResult{cfg: cfg, byResult: map[string]int{}, refused: map[string]int{}, callErrors: rec.callErrors,
		firstErrors: rec.firstErrors, renewed: rec.renewed, renewLost: rec.renewLost}

	// Final rows.
	type finalRow struct {
		status   string
		owner    string
		gen      int64
		attempts int
	}
	final := make(map[uuid.UUID]finalRow, len(ids))
	rows, err := admin.Query(ctx, "SELECT message_id, status, coalesce(lease_owner, ''), lease_generation, attempt_count FROM "+tableOf(cfg.queue))
	require.NoError(t, err)
	for rows.Next() {
		var id uuid.UUID
		var r finalRow
		require.NoError(t, rows.Scan(&id, &r.status, &r.owner, &r.gen, &r.attempts))
		final[id] = r
	}
	require.NoError(t, rows.Err())
	require.Len(t, final, len(ids), "rows lost or added")
	succeeded := string(cfg.queue.Succeeded())
	for _, id := range ids {
		r, ok := final[id]
		require.True(t, ok, "message %s lost", id)
		switch r.status {
		case succeeded:
			res.completed++
		case "dead_lettered":
			res.dead++
		default:
			t.Fatalf("message %s ended %s, not terminal", id, r.status)
		}
	}

	// Claims per message.
	claimsOf := map[uuid.UUID][]claimEvent{}
	for _, c := range rec.claims {
		claimsOf[c.id] = append(claimsOf[c.id], c)
		if c.gen > 1 {
			res.reclaims++
		}
	}
	res.claims = len(rec.claims)
	seenClaim := map[[2]any]bool{}
	for id, cs := range claimsOf {
		for _, c := range cs {
			k := [2]any{id, c.gen}
			require.False(t, seenClaim[k], "generation %d of %s claimed twice", c.gen, id)
			seenClaim[k] = true
			require.LessOrEqual(t, c.gen, final[id].gen, "claim of a generation the row never reached")
		}
		res.phantomClaims += int(final[id].gen) - len(cs)
	}

	// Writes: the fence, refusals, and who wrote the terminal state.
	sort.Slice(rec.writes, func(i, j int) bool { return rec.writes[i].start.Before(rec.writes[j].start) })
	terminalBy := map[uuid.UUID]map[int64]bool{}
	releases := map[uuid.UUID]map[int64]bool{}
	for _, w := range rec.writes {
		if w.outcome == "" {
			res.unknownWrites++
			continue
		}
		newer := false
		for _, c := range claimsOf[w.id] {
			if c.gen > w.gen && c.at.Before(w.start) {
				newer = true
				break
			}
		}
		if newer {
			res.writesAfterReclaim++
			// already_applied changes nothing either: it is the retry of a
			// write whose reply was lost after it had committed.
			require.Contains(t, []leasing.Outcome{leasing.OutcomeLost, leasing.OutcomeTerminal, leasing.OutcomeAlreadyApplied}, w.outcome,
				"%s of %s generation %d sent after generation >%d was claimed was not refused", w.kind, w.id, w.gen, w.gen)
		}
		switch w.outcome {
		case leasing.OutcomeLost, leasing.OutcomeTerminal, leasing.OutcomeNotFound:
			res.refused[string(w.outcome)]++
		case leasing.OutcomeAlreadyApplied:
			res.alreadyApplied++
		}
		if !w.outcome.Succeeded() {
			continue
		}
		switch w.kind {
		case "complete", "dead-letter":
			if terminalBy[w.id] == nil {
				terminalBy[w.id] = map[int64]bool{}
			}
			terminalBy[w.id][w.gen] = true
			r := final[w.id]
			require.Equal(t, r.gen, w.gen, "%s of %s succeeded for generation %d, but the row ended at %d", w.kind, w.id, w.gen, r.gen)
			require.Equal(t, r.owner, w.owner, "%s of %s", w.kind, w.id)
			want := succeeded
			if w.kind == "dead-letter" {
				want = "dead_lettered"
			}
			require.Equal(t, want, r.status, "%s of %s succeeded, but the row is %s", w.kind, w.id, r.status)
		case "release":
			if releases[w.id] == nil {
				releases[w.id] = map[int64]bool{}
			}
			releases[w.id][w.gen] = true
		}
	}
	for _, id := range ids {
		require.LessOrEqual(t, len(terminalBy[id]), 1, "message %s reached a terminal state under %d generations", id, len(terminalBy[id]))
		r := final[id]
		released := len(releases[id]) + rec.orphans[id]
		if cfg.dropReplyRate == 0 {
			require.Equal(t, int(r.gen)-released, r.attempts, "message %s: attempt_count vs generations minus releases", id)
		} else {
			// A release whose reply was dropped applied unrecorded: the
			// count is bounded by what was recorded and by the handler runs.
			require.LessOrEqual(t, r.attempts, int(r.gen)-released, "message %s: attempt_count vs generations minus releases", id)
		}
	}

	// Invocations.
	invOf := map[uuid.UUID][]invocation{}
	for _, inv := range rec.invocations {
		invOf[inv.id] = append(invOf[inv.id], inv)
		res.byResult[inv.result]++
		res.maxAttemptsSeen = max(res.maxAttemptsSeen, inv.attempt)
	}
	res.invocations = len(rec.invocations)
	for _, id := range ids {
		invs := invOf[id]
		res.invocationsPerMsgMax = max(res.invocationsPerMsgMax, len(invs))
		r := final[id]
		started := map[int64]bool{}
		for _, inv := range invs {
			require.False(t, started[inv.gen], "%s generation %d handled twice", id, inv.gen)
			started[inv.gen] = true
			require.True(t, seenClaim[[2]any{id, inv.gen}], "%s generation %d handled without a recorded claim", id, inv.gen)
		}
		for _, c := range claimsOf[id] {
			if !started[c.gen] && !releases[id][c.gen] {
				res.unstartedClaims++
			}
		}
		if len(terminalBy[id]) == 1 {
			// The generation that wrote the terminal state ran its handler
			// to the matching end.
			var last *invocation
			for i := range invs {
				if invs[i].gen == r.gen {
					last = &invs[i]
				}
			}
			if last == nil {
				// Claimed past MaxAttempts after attempts that ended without
				// an outcome: dead-lettered without running the handler.
				require.Equal(t, "dead_lettered", r.status, "%s: terminal state written by generation %d without an invocation", id, r.gen)
				require.Greater(t, r.attempts, cfg.maxAttempts, "%s: dead-lettered without an invocation before its attempts ran out", id)
				res.exhausted++
				continue
			}
			if r.status == succeeded {
				require.Equal(t, "ok", last.result, "%s completed but its handler returned %s", id, last.result)
			} else {
				require.Equal(t, "failed", last.result, "%s dead-lettered but its handler returned %s", id, last.result)
				require.GreaterOrEqual(t, last.attempt, cfg.maxAttempts)
				if len(invs) < cfg.maxAttempts {
					res.deadEarly++
				}
			}
		}
	}

	// Into the table, then the overlap check in SQL.
	copyRows := make([][]any, 0, len(rec.invocations))
	for _, inv := range rec.invocations {
		// Lease expiry is the database clock; invocation times are ours.
		valid := rec.expiry[[2]any{inv.id, inv.gen}].Add(-skew)
		copyRows = append(copyRows, []any{inv.id, inv.gen, inv.worker, inv.start, inv.end, valid, inv.result, inv.attempt})
	}
	_, err = admin.CopyFrom(ctx, pgx.Identifier{"stress_invocations"},
		[]string{"message_id", "lease_generation", "worker", "started_at", "finished_at", "lease_valid_until", "result", "attempt"},
		pgx.CopyFromRows(copyRows))
	require.NoError(t, err, "one invocation per (message, generation)")
	var overlaps int
	var example string
	err = admin.QueryRow(ctx, `
		SELECT count(*), coalesce(min(a.message_id::text || ' gen ' || a.lease_generation || '/' || b.lease_generation), '')
		FROM stress_invocations AS a
		JOIN stress_invocations AS b
		  ON b.message_id = a.message_id AND b.lease_generation > a.lease_generation
		WHERE b.started_at < least(a.finished_at, a.lease_valid_until)`).Scan(&overlaps, &example)
	require.NoError(t, err)
	require.Zero(t, overlaps, "invocations overlapped while both held a valid lease, e.g. %s", example)
	return res
}

// clockSkew estimates the database clock minus this process's clock, from
// the best of a few round trips.
func clockSkew(t *testing.T, admin *pgx.Conn) time.Duration {
	t.Helper()
	best, skew := time.Duration(1<<62), time.Duration(0)
	for range 5 {
		before := time.Now()
		var db time.Time
		require.NoError(t, admin.QueryRow(context.Background(), "SELECT clock_timestamp()").Scan(&db))
		after := time.Now()
		if rtt := after.Sub(before); rtt < best {
			best, skew = rtt, db.Sub(before.Add(rtt/2))
		}
	}
	return skew
}

// isConnErr reports whether err means the connection or server went away.
func isConnErr(err error) bool {
	if err == nil {
		return false
	}
	s := err.Error()
	for _, frag := range []string{"terminating connection", "connection reset", "conn closed", "EOF", "broken pipe",
		"connection refused", "the database system is", "shutting down", "57P01", "57P02", "57P03", "failed to connect", "unexpected EOF"} {
		if strings.Contains(s, frag) {
			return true
		}
	}
	return false
}

// reconnect connects to url, retrying for up to a minute (a server restart).
func reconnect(ctx context.Context, url string) (*pgx.Conn, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			return conn, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// restartServer restarts the local PostgreSQL 15 cluster and waits until it
// accepts connections again. Only the long form calls it: it breaks every
// session on the shared server.
func restartServer(t *testing.T) {
	out, err := exec.Command("pg_ctlcluster", "--skip-systemctl-redirect", "15", "main", "restart").CombinedOutput()
	if err != nil {
		t.Errorf("restart PostgreSQL: %v: %s", err, out)
	}
	ensureServerUp(t)
}

// ensureServerUp starts the cluster if it does not answer and waits until
// it does.
func ensureServerUp(t *testing.T) {
	ready := func() bool { return exec.Command("pg_isready", "-q", "-h", "127.0.0.1", "-p", "5432").Run() == nil }
	for range 120 {
		if ready() {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	_ = exec.Command("pg_ctlcluster", "--skip-systemctl-redirect", "15", "main", "start").Run()
	for range 120 {
		if ready() {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Errorf("PostgreSQL did not come back after the restart")
}
