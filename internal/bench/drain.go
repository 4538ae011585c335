package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/internal/explain"
	"github.com/leasestore/leasestore/internal/plural"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// drainAPI drains the table through the leasing API with cfg.Workers
// workers, each on a pool of one connection, while a sampler measures the
// claim plan every cfg.SampleEvery messages on a connection of its own.
func drainAPI(ctx context.Context, cfg Config, dbURL string, pool *pgxpool.Pool, t table, clean int64, progress *progress) (Drain, *Steady, error) {
	want := int64(cfg.Messages + cfg.ExpiredLeases)
	stores := make([]*leasing.Postgres, cfg.Workers+1) // the last one samples
	for i := range stores {
		pc, err := pgxpool.ParseConfig(dbURL)
		if err != nil {
			return Drain{}, nil, err
		}
		pc.MinConns, pc.MaxConns = 1, 1
		if !cfg.PlainPgx {
			pc.AfterConnect = leasing.RegisterTypes
		}
		wp, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			return Drain{}, nil, err
		}
		defer wp.Close()
		if err := wp.Ping(ctx); err != nil {
			return Drain{}, nil, err
		}
		if stores[i], err = leasing.NewPostgres(wp, cfg.Queue, leasing.PostgresOptions{}); err != nil {
			return Drain{}, nil, err
		}
	}
	vac0, _, err := tableStats(ctx, pool, t)
	if err != nil {
		return Drain{}, nil, err
	}

	var (
		drained, claimed atomic.Int64
		failed           atomic.Bool
		wg               sync.WaitGroup
		gate             sync.RWMutex // workers read-lock each loop; the sampler write-locks to quiesce
		workers          = make([]workerStats, cfg.Workers)
		sampleTick       = make(chan struct{}, 1)
		samplerDone      = make(chan []Sample, 1)
		runCtx, cancel   = context.WithCancelCause(ctx)
	)
	defer cancel(nil)
	go func() {
		samplerDone <- sample(runCtx, stores[cfg.Workers], pool, t, cfg.ExplainBatch, &drained, sampleTick, &gate)
	}()
	stopVacuum, err := keepVacuumed(runCtx, cfg, pool)
	if err != nil {
		return Drain{}, nil, err
	}
	stopProgress := progress.drain("leasing", want, &drained)

	for i := range workers {
		workers[i].reserve(cfg, want)
	}
	costs := drainCostsSince(ctx, pool)
	start := time.Now()
	for w := range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := work(runCtx, cfg, stores[w], want, &claimed, &drained, &workers[w], sampleTick, &gate)
			if err != nil {
				failed.Store(true)
				cancel(err)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	var d Drain
	costs(&d, want)
	stopProgress()
	cancel(nil)
	samples := <-samplerDone
	if err := stopVacuum(); err != nil {
		return Drain{}, nil, err
	}
	if failed.Load() {
		return Drain{}, nil, context.Cause(runCtx)
	}
	if err := ctx.Err(); err != nil {
		return Drain{}, nil, err
	}

	d.Method, d.Seconds, d.MessagesPerSecond = "leasing", elapsed.Seconds(), float64(want)/elapsed.Seconds()
	var claimLat, completeLat, pipelineLat []time.Duration
	seen := make(map[uuid.UUID]struct{}, want)
	var applied, dup int64
	for _, w := range workers {
		d.Claims += w.claims
		d.EmptyClaims += w.emptyClaims
		claimLat = append(claimLat, w.claimLat...)
		completeLat = append(completeLat, w.completeLat...)
		pipelineLat = append(pipelineLat, w.pipelineLat...)
		applied += w.applied
		for _, id := range w.ids {
			if _, ok := seen[id]; ok {
				dup++
			}
			seen[id] = struct{}{}
		}
	}
	d.ClaimP50Ms, d.ClaimP99Ms = percentileMs(claimLat, 0.50), percentileMs(claimLat, 0.99)
	d.CompleteP50Ms, d.CompleteP99Ms = percentileMs(completeLat, 0.50), percentileMs(completeLat, 0.99)
	d.CompleteAndClaimP50Ms, d.CompleteAndClaimP99Ms = percentileMs(pipelineLat, 0.50), percentileMs(pipelineLat, 0.99)
	d.RoundTrips = 1
	if cfg.TwoRoundTrips {
		d.RoundTrips = 2
	}
	if err := finish(ctx, &d, pool, t, want, vac0); err != nil {
		return Drain{}, nil, err
	}
	switch {
	case d.Problem != "":
	case dup > 0:
		d.Verified, d.Problem = false, plural.Count(dup, "message", "messages")+" leased twice"
	case applied != want:
		d.Verified, d.Problem = false, fmt.Sprintf("%s applied, want %d", plural.Count(applied, "completion", "completions"), want)
	}
	return d, steadyOf(samples, clean, cfg.ExplainBatch), nil
}

// workerStats is one worker's tally; only its worker writes it.
type workerStats struct {
	claims, emptyClaims                int
	applied                            int64
	ids                                []uuid.UUID
	claimLat, completeLat, pipelineLat []time.Duration
}

// reserve sizes st for a worker's even share of want messages and a
// quarter more, before the drain starts, so that neither the drain's clock
// nor its client CPU time counts the tally growing.
func (st *workerStats) reserve(cfg Config, want int64) {
	share := (want/int64(cfg.Workers) + int64(cfg.BatchSize)) * 5 / 4
	steps := share/int64(cfg.BatchSize) + 1
	st.ids = make([]uuid.UUID, 0, share)
	if cfg.TwoRoundTrips {
		st.claimLat, st.completeLat = make([]time.Duration, 0, steps), make([]time.Duration, 0, steps)
	} else {
		st.pipelineLat = make([]time.Duration, 0, steps)
	}
}

// work claims and completes batches until want messages were claimed in
// all and it holds none. Each step completes the batch the previous step
// claimed and claims the next, in one CompleteAndClaim call, or, with
// cfg.TwoRoundTrips, in a Complete call and a Claim call. An empty claim
// while messages remain (they are locked by another claim, or by the
// sampler's rolled-back one) is retried after 1 ms.
func work(ctx context.Context, cfg Config, store *leasing.Postgres, want int64, claimed, drained *atomic.Int64, st *workerStats, sampleTick chan<- struct{}, gate *sync.RWMutex) error {
	req := leasing.ClaimRequest{Owner: leasing.NewOwner("bench"), BatchSize: cfg.BatchSize, LeaseFor: cfg.LeaseFor}
	var held []leasing.Lease
	for len(held) > 0 || claimed.Load() < want {
		done := len(held)
		next, err := step(ctx, cfg, store, req, held, claimed.Load() < want, st, gate)
		if err != nil {
			return err
		}
		held = next
		claimed.Add(int64(len(next)))
		if done > 0 {
			before := drained.Add(int64(done)) - int64(done)
			if cfg.SampleEvery > 0 && (before+int64(done))/int64(cfg.SampleEvery) > before/int64(cfg.SampleEvery) {
				select {
				case sampleTick <- struct{}{}:
				default:
				}
			}
		}
		if len(next) == 0 && done == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	return nil
}

// step completes held (when not empty) and, when claim is set, claims the
// next batch, under a read lock of gate. It returns the new leases.
func step(ctx context.Context, cfg Config, store *leasing.Postgres, req leasing.ClaimRequest, held []leasing.Lease, claim bool, st *workerStats, gate *sync.RWMutex) ([]leasing.Lease, error) {
	gate.RLock()
	defer gate.RUnlock()
	var (
		res  leasing.WriteResult
		next []leasing.Lease
		err  error
	)
	t0 := time.Now()
	switch {
	case len(held) > 0 && claim && !cfg.TwoRoundTrips:
		res, next, err = store.CompleteAndClaim(ctx, held, req)
		st.pipelineLat = append(st.pipelineLat, time.Since(t0))
	default:
		if len(held) > 0 {
			if res, err = store.Complete(ctx, held...); err != nil {
				return nil, err
			}
			st.completeLat = append(st.completeLat, time.Since(t0))
		}
		if claim {
			t1 := time.Now()
			next, err = store.Claim(ctx, req)
			st.claimLat = append(st.claimLat, time.Since(t1))
		}
	}
	if err != nil {
		return nil, err
	}
	if claim {
		st.claims++
		if len(next) == 0 {
			st.emptyClaims++
		}
	}
	st.applied += int64(res.Count(leasing.OutcomeApplied))
	for _, l := range held {
		st.ids = append(st.ids, l.Message.ID)
	}
	return next, nil
}

// sample measures a claim plan each time tick fires until ctx ends.
func sample(ctx context.Context, store *leasing.Postgres, pool *pgxpool.Pool, t table, batch int, drained *atomic.Int64, tick <-chan struct{}, gate *sync.RWMutex) []Sample {
	var out []Sample
	for {
		select {
		case <-ctx.Done():
			return out
		case <-tick:
		}
		at := drained.Load()
		live, err := explain.Claim(ctx, store.Pool(), store.Queue(), batch, explain.Options{})
		if err != nil {
			continue // the drain ending cancels ctx mid-explain
		}
		gate.Lock()
		quiet, err := explain.Claim(ctx, store.Pool(), store.Queue(), batch, explain.Options{})
		gate.Unlock()
		if err != nil {
			continue
		}
		vac, dead, _ := tableStats(ctx, pool, t)
		out = append(out, Sample{
			Drained: at, Rows: quiet.Rows, Buffers: quiet.Buffers, Ms: ms(quiet.Duration),
			LiveRows: live.Rows, LiveBuffers: live.Buffers, LiveMs: ms(live.Duration),
			DeadTuples: dead, Autovacuums: vac.auto, Vacuums: vac.manual,
		})
	}
}

// keepVacuumed runs the vacuum policy of cfg on the table during a drain,
// as processors do (processor.KeepVacuumed), until stop is called;
// stop returns the first error the policy reported.
func keepVacuumed(ctx context.Context, cfg Config, pool *pgxpool.Pool) (stop func() error, err error) {
	store, err := leasing.NewPostgres(pool, cfg.Queue, leasing.PostgresOptions{})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	var (
		mu    sync.Mutex
		first error
	)
	onError := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if first == nil {
			first = fmt.Errorf("bench: vacuum policy: %w", err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- processor.KeepVacuumed(ctx, store, cfg.Vacuum, onError) }()
	return func() error {
		cancel()
		err := <-done
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			return err
		}
		return first
	}, nil
}

func steadyOf(samples []Sample, clean int64, batch int) *Steady {
	if len(samples) == 0 {
		return nil
	}
	s := &Steady{Samples: samples, CleanBuffers: clean}
	var quiet, live []int64
	for _, x := range samples {
		if x.Rows == batch {
			quiet = append(quiet, x.Buffers)
		}
		if x.LiveRows == batch {
			live = append(live, x.LiveBuffers)
		}
	}
	s.P50Buffers, s.MaxBuffers, s.MaxRatio = spread(quiet, clean)
	s.LiveP50Buffers, s.LiveMaxBuffers, s.LiveMaxRatio = spread(live, clean)
	return s
}

// spread returns the median and maximum of v and the maximum over clean.
func spread(v []int64, clean int64) (p50, maxV int64, ratio float64) {
	if len(v) == 0 {
		return 0, 0, 0
	}
	slices.Sort(v)
	p50, maxV = v[len(v)/2], v[len(v)-1]
	if clean > 0 {
		ratio = float64(maxV) / float64(clean)
	}
	return p50, maxV, ratio
}

// finish verifies the table after a drain and records the VACUUMs run
// since vac0.
func finish(ctx context.Context, d *Drain, pool *pgxpool.Pool, t table, want int64, vac0 vacuumCounts) error {
	v, err := verify(ctx, pool, t)
	if err != nil {
		return fmt.Errorf("bench: verify: %w", err)
	}
	d.Problem = v.problem(want)
	d.Verified = d.Problem == ""
	vac, _, err := tableStats(ctx, pool, t)
	if err != nil {
		return err
	}
	d.Autovacuums, d.Vacuums, d.KeyVacuums = vac.auto-vac0.auto, vac.manual-vac0.manual, vac.keys-vac0.keys
	return nil
}
