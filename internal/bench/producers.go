package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// The producer mode (Config.Producers > 0) measures the work signal: what
// it costs the producers and how fast it wakes a processor. Producers are
// goroutines on connections of their own, each committing one message per
// transaction through EnqueueTx, as the transactional outbox does.
//
//   - Throughput: the producers enqueue as fast as they can for
//     Config.PhaseDuration, once with the schema's signal (its insert
//     triggers on) and once with no signal at all (the table's user
//     triggers disabled in the bench's own database), Config.Rounds times,
//     alternating which goes first. A Listener is connected in both, so
//     that a notifying commit pays for a listening session as in service.
//     No processor runs: both variants get the same CPU.
//   - Pickup: a processor woken by a Listener drains while the producers
//     enqueue at each of Config.Rates messages/s, then as fast as they
//     can. Pickup latency is from the producer's commit returning to the
//     handler's start (both on this process's clock).

// ProducerResult is what a producer-mode Run measured.
type ProducerResult struct {
	// Database is the database Run created; Kept says whether it is still there.
	Database string `json:"database"`
	Kept     bool   `json:"kept"`
	Queue    string `json:"queue"`
	// Producers is the number of producer connections.
	Producers int `json:"producers"`
	// PhaseSeconds is the length of each phase in seconds.
	PhaseSeconds float64 `json:"phase_seconds"`
	// Throughput holds the unthrottled phases in the order they ran.
	Throughput []ThroughputPhase `json:"throughput"`
	// SignalPerSecond and NoSignalPerSecond are the medians over the
	// rounds of enqueues/s with the signal and without; Ratio is
	// SignalPerSecond / NoSignalPerSecond.
	SignalPerSecond   float64 `json:"signal_per_second"`
	NoSignalPerSecond float64 `json:"no_signal_per_second"`
	Ratio             float64 `json:"ratio"`
	// Pickup holds the phases with a processor, one per rate and the last
	// unthrottled (TargetRate 0).
	Pickup []PickupPhase `json:"pickup"`
}

// ThroughputPhase is one unthrottled phase without a processor.
type ThroughputPhase struct {
	// Signal is "signal" (the schema's triggers on) or "none" (disabled).
	Signal            string  `json:"signal"`
	Enqueued          int64   `json:"enqueued"`
	Seconds           float64 `json:"seconds"`
	EnqueuesPerSecond float64 `json:"enqueues_per_second"`
	// CommitP50Ms and CommitP99Ms are the producers' enqueue transaction
	// latencies (begin to commit returned), in milliseconds.
	CommitP50Ms float64 `json:"commit_p50_ms"`
	CommitP99Ms float64 `json:"commit_p99_ms"`
}

// PickupPhase is one phase with a Listener-driven processor draining.
type PickupPhase struct {
	// TargetRate is the producers' combined rate in messages/s; 0 for as
	// fast as they can.
	TargetRate        int     `json:"target_rate"`
	Enqueued          int64   `json:"enqueued"`
	EnqueuesPerSecond float64 `json:"enqueues_per_second"`
	// Picked is the number of messages whose handler started; every
	// enqueued message must be, or the phase fails.
	Picked int `json:"picked"`
	// P50Ms, P99Ms and MaxMs are the pickup latencies in milliseconds.
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
	MaxMs float64 `json:"max_ms"`
	// Claims counts the processor's claim calls the store answered
	// during the phase.
	Claims int64 `json:"claims"`
	// ClaimP50Ms, ClaimP99Ms and ClaimMaxMs are the durations of those
	// calls in milliseconds, from the processor's side (round trip and
	// commit included): a slow claim delays every message behind it, so
	// they tell a stalled server from a slow signal.
	ClaimP50Ms float64 `json:"claim_p50_ms"`
	ClaimP99Ms float64 `json:"claim_p99_ms"`
	ClaimMaxMs float64 `json:"claim_max_ms"`
}

// Producer-mode processor settings: enough slots and batch to keep up
// with thousands of messages/s on a small machine, and to catch up after
// a stall of the server: at full speed 32 producers reach about 4,000
// messages/s on 2 cores, and a claim of 100 in about 5 ms drains more
// than twice that.
const (
	producerBenchConcurrency = 64
	producerBenchBatch       = 100
)

// disableTriggers and enableTriggers turn the user triggers of the two
// queue tables off and on: the no-signal variant. Run only in the bench's
// own database.
const (
	disableInboxTriggers  = "ALTER TABLE inbox_messages DISABLE TRIGGER USER"
	enableInboxTriggers   = "ALTER TABLE inbox_messages ENABLE TRIGGER USER"
	disableOutboxTriggers = "ALTER TABLE outbox_messages DISABLE TRIGGER USER"
	enableOutboxTriggers  = "ALTER TABLE outbox_messages ENABLE TRIGGER USER"
)

func setTriggers(ctx context.Context, pool *pgxpool.Pool, q leasing.Queue, on bool) error {
	var err error
	switch {
	case q == leasing.Inbox && on:
		_, err = pool.Exec(ctx, enableInboxTriggers)
	case q == leasing.Inbox:
		_, err = pool.Exec(ctx, disableInboxTriggers)
	case on:
		_, err = pool.Exec(ctx, enableOutboxTriggers)
	default:
		_, err = pool.Exec(ctx, disableOutboxTriggers)
	}
	return err
}

// runProducers is Run in producer mode.
func runProducers(ctx context.Context, cfg Config, out io.Writer) (res ProducerResult, err error) {
	res = ProducerResult{Queue: string(cfg.Queue), Producers: cfg.Producers, PhaseSeconds: cfg.PhaseDuration.Seconds()}
	name, dbURL, drop, err := runDatabase(ctx, cfg)
	if err != nil {
		return res, err
	}
	res.Database, res.Kept = name, cfg.Keep
	defer drop(&err)
	if err := producerPhases(ctx, cfg, dbURL, &res); err != nil {
		return res, err
	}
	if cfg.JSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return res, enc.Encode(res)
	}
	return res, writeProducerText(out, res)
}

func producerPhases(ctx context.Context, cfg Config, dbURL string, res *ProducerResult) error {
	store, err := openStore(ctx, dbURL, int32(cfg.Producers+8), cfg.Queue)
	if err != nil {
		return err
	}
	pool := store.Pool()
	defer pool.Close()
	t := tableOf(cfg.Queue)
	progress := newProgress(cfg.Progress)
	defer progress.done()

	var sig, none []float64
	for round := range cfg.Rounds {
		order := []bool{true, false}
		if round%2 == 1 {
			order = []bool{false, true}
		}
		for _, on := range order {
			label := map[bool]string{true: "signal", false: "none"}[on]
			progress.status("round %d/%d: %d producers, %s", round+1, cfg.Rounds, cfg.Producers, label)
			if err := setTriggers(ctx, pool, cfg.Queue, on); err != nil {
				return fmt.Errorf("bench: set triggers: %w", err)
			}
			ph, err := throughputPhase(ctx, cfg, pool, store)
			if err != nil {
				return err
			}
			ph.Signal = label
			res.Throughput = append(res.Throughput, ph)
			if on {
				sig = append(sig, ph.EnqueuesPerSecond)
			} else {
				none = append(none, ph.EnqueuesPerSecond)
			}
			if err := truncate(ctx, pool, t); err != nil {
				return err
			}
		}
	}
	if err := setTriggers(ctx, pool, cfg.Queue, true); err != nil {
		return fmt.Errorf("bench: set triggers: %w", err)
	}
	res.SignalPerSecond, res.NoSignalPerSecond = median(sig), median(none)
	if res.NoSignalPerSecond > 0 {
		res.Ratio = res.SignalPerSecond / res.NoSignalPerSecond
	}
	for _, rate := range append(slices.Clone(cfg.Rates), 0) {
		progress.status("pickup: %d producers at %s", cfg.Producers, rateText(rate))
		ph, err := pickupPhase(ctx, cfg, pool, store, rate)
		if err != nil {
			return err
		}
		res.Pickup = append(res.Pickup, ph)
		if err := truncate(ctx, pool, t); err != nil {
			return err
		}
	}
	return nil
}

func rateText(rate int) string {
	if rate == 0 {
		return "full speed"
	}
	return fmt.Sprintf("%d/s", rate)
}

// produce runs cfg.Producers producers for cfg.PhaseDuration at a combined
// rate (0: unthrottled). Each commit's message id and the time its commit
// returned go to committed, when not nil. It returns the number committed,
// the time taken and the transaction latencies.
func produce(ctx context.Context, cfg Config, pool *pgxpool.Pool, store *leasing.Postgres, rate int,
	committed func(uuid.UUID, time.Time)) (int64, time.Duration, []time.Duration, error) {
	var (
		wg    sync.WaitGroup
		n     atomic.Int64
		mu    sync.Mutex
		lats  []time.Duration
		first error
	)
	payload := make([]byte, cfg.PayloadBytes)
	start := time.Now()
	end := start.Add(cfg.PhaseDuration)
	for range cfg.Producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var every time.Duration
			next := start
			if rate > 0 {
				every = time.Duration(float64(time.Second) * float64(cfg.Producers) / float64(rate))
				next = start.Add(time.Duration(rand.Int64N(int64(every))))
			}
			var mine []time.Duration
			defer func() { mu.Lock(); lats = append(lats, mine...); mu.Unlock() }()
			for {
				if every > 0 {
					if d := time.Until(next); d > 0 {
						time.Sleep(d)
					}
					next = next.Add(every)
				}
				if !time.Now().Before(end) || ctx.Err() != nil {
					return
				}
				id := uuid.Must(uuid.NewV7())
				t0 := time.Now()
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := store.EnqueueTx(ctx, tx, leasing.NewMessage{ID: id, Type: kindDue, Payload: payload})
					return err
				})
				done := time.Now()
				if err != nil {
					mu.Lock()
					first = cmpOr(first, err)
					mu.Unlock()
					return
				}
				if committed != nil {
					committed(id, done)
				}
				mine = append(mine, done.Sub(t0))
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	return n.Load(), time.Since(start), lats, first
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// throughputPhase runs the producers unthrottled with a Listener connected
// (its wakes are drained and dropped) and no processor.
func throughputPhase(ctx context.Context, cfg Config, pool *pgxpool.Pool, store *leasing.Postgres) (ThroughputPhase, error) {
	lctx, stop := context.WithCancel(ctx)
	listener, err := leasing.NewListener(pool.Config().ConnConfig, cfg.Queue, leasing.ListenerOptions{})
	if err != nil {
		stop()
		return ThroughputPhase{}, err
	}
	var lwg sync.WaitGroup
	lwg.Add(2)
	go func() { defer lwg.Done(); _ = listener.Run(lctx) }()
	go func() {
		defer lwg.Done()
		for {
			select {
			case <-lctx.Done():
				return
			case <-listener.Wake():
			}
		}
	}()
	defer func() { stop(); lwg.Wait() }()
	if err := waitListening(ctx, listener); err != nil {
		return ThroughputPhase{}, err
	}
	n, took, lats, err := produce(ctx, cfg, pool, store, 0, nil)
	if err != nil {
		return ThroughputPhase{}, fmt.Errorf("bench: produce: %w", err)
	}
	return ThroughputPhase{
		Enqueued: n, Seconds: took.Seconds(), EnqueuesPerSecond: float64(n) / took.Seconds(),
		CommitP50Ms: percentileMs(lats, 0.50), CommitP99Ms: percentileMs(lats, 0.99),
	}, nil
}

// waitListening waits until listener has its LISTEN in place.
func waitListening(ctx context.Context, listener *leasing.Listener) error {
	deadline := time.Now().Add(30 * time.Second)
	for listener.BackendPID() == 0 {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errors.New("bench: the listener did not connect within 30 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// countingStore counts the claims a processor sends and times them.
type countingStore struct {
	*leasing.Postgres
	mu   sync.Mutex
	took []time.Duration // since the last takeClaims
}

func (s *countingStore) Claim(ctx context.Context, r leasing.ClaimRequest) ([]leasing.Lease, error) {
	sent := time.Now()
	leases, err := s.Postgres.Claim(ctx, r)
	took := time.Since(sent)
	s.mu.Lock()
	s.took = append(s.took, took)
	s.mu.Unlock()
	return leases, err
}

// takeClaims returns the durations of the claims answered since the last
// call, sorted, and forgets them.
func (s *countingStore) takeClaims() []time.Duration {
	s.mu.Lock()
	took := s.took
	s.took = nil
	s.mu.Unlock()
	slices.Sort(took)
	return took
}

// pickupPhase runs the producers at rate (0: unthrottled) while a
// Listener-driven processor drains, and measures pickup latency.
func pickupPhase(ctx context.Context, cfg Config, pool *pgxpool.Pool, store *leasing.Postgres, rate int) (PickupPhase, error) {
	var (
		mu      sync.Mutex
		commits = map[uuid.UUID]time.Time{}
		starts  = map[uuid.UUID]time.Time{}
		picked  atomic.Int64
	)
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	listener, err := leasing.NewListener(pool.Config().ConnConfig, cfg.Queue, leasing.ListenerOptions{})
	if err != nil {
		return PickupPhase{}, err
	}
	cs := &countingStore{Postgres: store}
	var errMu sync.Mutex
	var procErr error
	proc, err := processor.New(cs, func(_ context.Context, l leasing.Lease) error {
		now := time.Now()
		mu.Lock()
		if _, dup := starts[l.Message.ID]; !dup {
			starts[l.Message.ID] = now
		}
		mu.Unlock()
		picked.Add(1)
		return nil
	}, processor.Options{
		Owner: "bench-pickup", Concurrency: producerBenchConcurrency, BatchSize: producerBenchBatch,
		WorkSignal: listener, Vacuum: cfg.Vacuum,
		OnError: func(err error) {
			if !errors.Is(err, context.Canceled) {
				errMu.Lock()
				procErr = cmpOr(procErr, err)
				errMu.Unlock()
			}
		},
	})
	if err != nil {
		return PickupPhase{}, err
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = listener.Run(pctx) }()
	go func() { defer wg.Done(); _ = proc.Run(pctx) }()
	defer func() { stop(); wg.Wait() }()
	if err := waitListening(ctx, listener); err != nil {
		return PickupPhase{}, err
	}
	time.Sleep(100 * time.Millisecond) // the listener's first wake claims nothing
	cs.takeClaims()
	n, took, _, err := produce(ctx, cfg, pool, store, rate, func(id uuid.UUID, at time.Time) {
		mu.Lock()
		commits[id] = at
		mu.Unlock()
	})
	if err != nil {
		return PickupPhase{}, fmt.Errorf("bench: produce: %w", err)
	}
	// Wait for the processor to start every message: at most one poll
	// ceiling (the Options' PollInterval) and a margin.
	deadline := time.Now().Add(proc.Options().PollInterval + 30*time.Second)
	for picked.Load() < n && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	claims := cs.takeClaims()
	ph := PickupPhase{TargetRate: rate, Enqueued: n, EnqueuesPerSecond: float64(n) / took.Seconds(), Claims: int64(len(claims))}
	if len(claims) > 0 {
		ph.ClaimP50Ms, ph.ClaimP99Ms = percentileMs(claims, 0.50), percentileMs(claims, 0.99)
		ph.ClaimMaxMs = ms(claims[len(claims)-1])
	}
	mu.Lock()
	defer mu.Unlock()
	lats := make([]time.Duration, 0, len(commits))
	for id, c := range commits {
		if s, ok := starts[id]; ok {
			lats = append(lats, max(s.Sub(c), 0))
		}
	}
	ph.Picked = len(lats)
	if int64(ph.Picked) < n {
		errMu.Lock()
		defer errMu.Unlock()
		return ph, fmt.Errorf("bench: %d of %d messages were picked up within the poll ceiling + 30 s (processor error: %v)", ph.Picked, n, procErr)
	}
	slices.Sort(lats)
	ph.P50Ms, ph.P99Ms, ph.MaxMs = percentileMs(lats, 0.50), percentileMs(lats, 0.99), ms(lats[len(lats)-1])
	return ph, nil
}

// writeProducerText writes res as a report for people.
func writeProducerText(w io.Writer, res ProducerResult) error {
	var b strings.Builder
	fmt.Fprintf(&b, "queue %s, %d producers, one message per transaction (EnqueueTx), %.0f s phases\n", res.Queue, res.Producers, res.PhaseSeconds)
	for _, p := range res.Throughput {
		fmt.Fprintf(&b, "  %-6s %7.0f enqueues/s (%d in %.1f s), commit p50 %.2f ms p99 %.2f ms\n",
			p.Signal, p.EnqueuesPerSecond, p.Enqueued, p.Seconds, p.CommitP50Ms, p.CommitP99Ms)
	}
	fmt.Fprintf(&b, "enqueues/s: signal %.0f, no signal %.0f (medians): %.2fx\n", res.SignalPerSecond, res.NoSignalPerSecond, res.Ratio)
	fmt.Fprintf(&b, "pickup latency, commit to handler start, Listener-driven processor (%d slots, batch %d):\n", producerBenchConcurrency, producerBenchBatch)
	for _, p := range res.Pickup {
		fmt.Fprintf(&b, "  at %-10s %7.0f enqueues/s: p50 %.2f ms, p99 %.2f ms, max %.2f ms; %d messages, %d claims (p50 %.2f ms, p99 %.2f ms, max %.2f ms)\n",
			rateText(p.TargetRate), p.EnqueuesPerSecond, p.P50Ms, p.P99Ms, p.MaxMs, p.Picked, p.Claims, p.ClaimP50Ms, p.ClaimP99Ms, p.ClaimMaxMs)
	}
	if res.Kept {
		fmt.Fprintf(&b, "database kept: %s\n", res.Database)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
