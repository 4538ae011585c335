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
// (processor.New) sharing one pool of cfg.Workers connections, each with
// Concurrency and BatchSize cfg.BatchSize and a handler that returns at
// once. The pool has as many connections as the API loop has workers and
// the pgbench loop clients, so that the three drains run as many
// statements at once: with a connection per claim loop and per writer,
// and a second claim in flight, four processors ran up to twelve, which
// cost the server about a quarter more CPU per message drained
// (docs/notes/2026-12-05-processor-connections.md). The drain
// runs from the first Run to the last Run's return, after the last
// handler call, its outcomes written. The vacuum policy runs once, beside
// them, as in the other drains.
func drainProcessors(ctx context.Context, cfg Config, dbURL string, pool *pgxpool.Pool, t table, progress *progress) (Drain, error) {
	want := int64(cfg.Messages + cfg.ExpiredLeases)
	pc, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return Drain{}, err
	}
	pc.MaxConns = int32(cfg.Workers)
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

	vac0, _, err := tableStats(ctx, pool, t)
	if err != nil {
		return Drain{}, err
	}
	stopVacuum, err := keepVacuumed(ctx, cfg, pool)
	if err != nil {
		return Drain{}, err
	}
	var handled atomic.Int64
	stopProgress := progress.drain("processor", want, &handled)
	costs := drainCostsSince(ctx, pool)
	elapsed, err := RunProcessors(ctx, pp, cfg.Queue, ProcessorDrain{
		Processors: cfg.Workers, Concurrency: cfg.BatchSize, BatchSize: cfg.BatchSize, Handled: &handled,
		Options: processor.Options{
			LeaseDuration: cfg.LeaseFor, PollInterval: processorPoll, Vacuum: processor.VacuumPolicy{Disabled: true},
			MergeCompletions: cfg.MergeCompletions,
		},
	}, want)
	var d Drain
	costs(&d, want)
	stopProgress()
	if vacErr := stopVacuum(); err == nil {
		err = vacErr
	}
	if err != nil {
		return Drain{}, fmt.Errorf("bench: %w", err)
	}

	d.Method, d.Seconds, d.MessagesPerSecond = "processor", elapsed.Seconds(), float64(want)/elapsed.Seconds()
	if err := finish(ctx, &d, pool, t, want, vac0); err != nil {
		return Drain{}, err
	}
	if n := handled.Load(); d.Verified && n != want {
		d.Verified, d.Problem = false, fmt.Sprintf("%d handler calls for %d messages", n, want)
	}
	return d, nil
}

// ProcessorDrain is a drain by processors that share one pool.
type ProcessorDrain struct {
	// Processors, Concurrency and BatchSize shape it: Processors
	// processors (processor.New), each with that Concurrency and BatchSize.
	Processors, Concurrency, BatchSize int
	// Options are the rest of each processor's options; RunProcessors sets
	// Concurrency, BatchSize and OnError.
	Options processor.Options
	// Work is what each handler call does before it returns (nil: nothing).
	Work func(context.Context) error
	// Handled counts the handler calls that returned nil; may be nil.
	Handled *atomic.Int64
}

// RunProcessors runs d's processors on queue q of pool until their
// handlers have returned nil want times, then stops them and waits for
// every Run to return, its outcomes written. It returns the time from the
// first Run to the last return.
//
// Errors: processor.New's, the first error a processor reported to
// OnError, or ctx's, with the handler calls made.
func RunProcessors(ctx context.Context, pool *pgxpool.Pool, q leasing.Queue, d ProcessorDrain, want int64) (time.Duration, error) {
	handled := d.Handled
	if handled == nil {
		handled = new(atomic.Int64)
	}
	all := make(chan struct{})
	handler := func(ctx context.Context, _ leasing.Lease) error {
		if d.Work != nil {
			if err := d.Work(ctx); err != nil {
				return err
			}
		}
		if handled.Add(1) == want {
			close(all)
		}
		return nil
	}
	var (
		errMu    sync.Mutex
		firstErr error
	)
	opts := d.Options
	opts.Concurrency, opts.BatchSize = d.Concurrency, d.BatchSize
	opts.OnError = func(err error) {
		errMu.Lock()
		defer errMu.Unlock()
		if firstErr == nil {
			firstErr = fmt.Errorf("processor: %w", err)
		}
	}
	procs := make([]*processor.Processor, d.Processors)
	for i := range procs {
		store, err := leasing.NewPostgres(pool, q, leasing.PostgresOptions{})
		if err != nil {
			return 0, err
		}
		if procs[i], err = processor.New(store, handler, opts); err != nil {
			return 0, err
		}
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
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
	took := time.Since(start)
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("%d of %d handled: %w", handled.Load(), want, err)
	}
	errMu.Lock()
	defer errMu.Unlock()
	return took, firstErr
}
