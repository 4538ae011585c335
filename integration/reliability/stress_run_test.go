package reliability_test

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	mathrand "math/rand/v2"
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
	checkSchemaPatiently(t, loader)
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
	starts := firstGenerations(t, admin, cfg.queue)

	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	app := "lst-" + hex.EncodeToString(suffix[:]) // this run's backends, for the killer
	rec := newStressRecorder()
	dropper := newReplyDropper(cfg.dropReplyRate, startsStatement, "the statement")
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
		pg, err := leasing.NewPostgres(pool, cfg.queue, leasing.PostgresOptions{SkipSchemaCheck: true}) // checked once, below the loader
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

	// Each kill costs a new backend and its statements prepared anew.
	// Where a backend takes tens of milliseconds of CPU to start, a kill
	// every ~40ms took the whole machine and the run stopped making
	// progress (20 to 472 of 800 messages finished in 90 s on 2 cores
	// whose backends took 25-48 ms to start). So kills come at most about
	// every eight backend starts, measured before the workers start.
	killEvery := cfg.killEvery
	if killEvery > 0 {
		killEvery = max(killEvery, 8*backendStart(t, url))
		t.Logf("a backend killed every ~%s", killEvery)
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
	if killEvery > 0 {
		// A connection younger than killMinAge is left alone, so that each
		// new connection gets to run statements.
		const killMinAge = 250 * time.Millisecond
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
				time.Sleep(time.Duration(float64(killEvery) * (0.5 + mathrand.Float64())))
				rows, err := conn.Query(ctx, `
					SELECT coalesce(substring(query FROM '-- name: (\w+)'), state), pg_terminate_backend(pid)
					FROM pg_stat_activity
					WHERE application_name = $1 AND datname = current_database()
					  AND backend_start < now() - $2::interval
					ORDER BY (state = 'active') DESC, random()
					LIMIT 1`, app, killMinAge)
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

	res := checkStress(t, cfg, admin, ids, starts, rec, clockSkew(t, admin))
	res.elapsed = elapsed
	res.kills = kills
	res.dropped = dropper.dropped.Load()
	res.workerCrashes = int(workerCrashes.Load())
	res.restarts = restarts
	res.processorErrors = processorErrors.Load()
	return res
}

// checkSchemaPatiently runs pg's schema check with no deadline, once for
// the run: the workers' stores skip theirs. Otherwise each worker's first
// calls run it, each within one lease (300 ms): the check is three round
// trips on fresh connections, and on a loaded machine (load 10 on 2
// cores) every try timed out, the timeout closed the connection, and the
// next try started over, so that no worker claimed anything for the whole
// run. The check is not what the stress run tests.
func checkSchemaPatiently(t *testing.T, pg *leasing.Postgres) {
	t.Helper()
	require.NoError(t, pg.CheckSchema(context.Background()), "schema check")
}
