package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// processorPoll is the processors' PollInterval in a drain: they claim
// again as soon as a claim comes back full, so the interval only bounds
// the wait for the last, partial batches.
const processorPoll = 10 * time.Millisecond

// drainProcessors drains the table with cfg.Workers processors
// (processor.New) sharing one pool of two connections each (the claim
// loop's and the writer's) and one more, each with Concurrency and
// BatchSize cfg.BatchSize and a handler that returns at once. The drain
// runs from the first Run to the last Run's return, after the last
// handler call, its outcomes written. The vacuum policy runs once, beside
// them, as in the other drains.
func drainProcessors(ctx context.Context, cfg Config, dbURL string, pool *pgxpool.Pool, t table, progress *progress) (Drain, error) {
	want := int64(cfg.Messages + cfg.ExpiredLeases)
	pc, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return Drain{}, err
	}
	pc.MaxConns = int32(2*cfg.Workers + 1)
	if !cfg.PlainPgx {
		pc.AfterConnect = leasing.RegisterTypes
	}
	pp, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return Drain{}, err
	}
	defer pp.Close()
	if err := pp.Ping(ctx); err != nil {
		return Drain{}, err
	}

	var (
		handled  atomic.Int64
		all      = make(chan struct{})
		errMu    sync.Mutex
		firstErr error
	)
	handler := func(context.Context, leasing.Lease) error {
		if handled.Add(1) == want {
			close(all)
		}
		return nil
	}
	onError := func(err error) {
		errMu.Lock()
		defer errMu.Unlock()
		if firstErr == nil {
			firstErr = fmt.Errorf("bench: processor: %w", err)
		}
	}
	procs := make([]*processor.Processor, cfg.Workers)
	for i := range procs {
		store, err := leasing.NewPostgres(pp, cfg.Queue, leasing.PostgresOptions{})
		if err != nil {
			return Drain{}, err
		}
		procs[i], err = processor.New(store, handler, processor.Options{
			Concurrency: cfg.BatchSize, BatchSize: cfg.BatchSize, LeaseDuration: cfg.LeaseFor,
			PollInterval: processorPoll, Vacuum: processor.VacuumPolicy{Disabled: true}, OnError: onError,
		})
		if err != nil {
			return Drain{}, err
		}
	}
	vac0, _, err := tableStats(ctx, pool, t)
	if err != nil {
		return Drain{}, err
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	stopVacuum, err := keepVacuumed(runCtx, cfg, pool)
	if err != nil {
		return Drain{}, err
	}
	stopProgress := progress.drain("processor", want, &handled)
	var wg sync.WaitGroup
	cpu0, cpuKnown := ProcessCPU()
	start := time.Now()
	for _, p := range procs {
		wg.Go(func() { _ = p.Run(runCtx) })
	}
	select {
	case <-all:
	case <-ctx.Done():
	}
	stop()
	wg.Wait()
	elapsed := time.Since(start)
	cpu1, _ := ProcessCPU()
	stopProgress()
	if err := stopVacuum(); err != nil {
		return Drain{}, err
	}
	if err := ctx.Err(); err != nil {
		return Drain{}, err
	}
	if firstErr != nil {
		return Drain{}, firstErr
	}

	d := Drain{Method: "processor", Seconds: elapsed.Seconds(), MessagesPerSecond: float64(want) / elapsed.Seconds()}
	if cpuKnown {
		d.ClientCPUSeconds = (cpu1 - cpu0).Seconds()
	}
	if err := finish(ctx, &d, pool, t, want, vac0); err != nil {
		return Drain{}, err
	}
	if n := handled.Load(); d.Verified && n != want {
		d.Verified, d.Problem = false, fmt.Sprintf("%d handler calls for %d messages", n, want)
	}
	return d, nil
}
