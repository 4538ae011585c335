// Command river drains the same backlog with River, in the configuration of
// River's own benchmark (riverbench: FetchCooldown 2 ms, FetchPollInterval
// 20 ms, 2,000 workers), and with leasestore Processors, in alternating
// rounds of one run on one server, and prints each drain's messages/s and
// every Processor variant's ratio to River's drain of the same round.
//
// It is a module of its own so that River is a dependency of this harness
// only. It creates a database next to -database (leasestore_river_bench_<pid>),
// migrates both schemas into it and drops it at the end. Run it from this
// directory, on a machine otherwise idle (ratios from one run are what to
// compare; absolute figures move with the load):
//
//	cd internal/bench/river
//	go run . -database 'postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable' \
//	    -jobs 200000 -rounds 3 -work 0 -processors 4x100x100,4x100x100m,1x2000x1000
//
// -work 1ms makes every job and handler sleep 1 ms (a broker call).
// Each drain starts from a table holding exactly -jobs due rows,
// vacuumed and analysed; River's jobs are inserted with InsertMany in
// batches of 5,000, as riverbench does, off the clock. A River drain ends
// at the last completion event (River's completer has written it); a
// Processor drain ends when every Run returned, its last outcomes written,
// after the last handler call. Both use pgx pools of -conns connections.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/leasestore/leasestore/db"
	"github.com/leasestore/leasestore/internal/bench"
	"github.com/leasestore/leasestore/internal/pgadmin"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// config is what the flags set.
type config struct {
	adminURL     string
	jobs         int
	rounds       int
	work         time.Duration
	riverWorkers int
	conns        int
	processors   []shape
	timeout      time.Duration
}

// shape is one Processor variant: processors sharing one pool, each with
// concurrency worker slots and claims of batch, with
// Options.MergeCompletions when merge.
type shape struct {
	processors, concurrency, batch int
	merge                          bool
}

func (s shape) String() string {
	name := fmt.Sprintf("processor %dx%dx%d", s.processors, s.concurrency, s.batch)
	if s.merge {
		name += "m"
	}
	return name
}

// parseShapes parses "PxCxB,..." into shapes; a trailing m (4x100x100m)
// sets MergeCompletions.
func parseShapes(v string) ([]shape, error) {
	var out []shape
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		merge := strings.HasSuffix(part, "m")
		f := strings.Split(strings.TrimSuffix(part, "m"), "x")
		if len(f) != 3 {
			return nil, fmt.Errorf("processor variant %q: want processors x concurrency x batch, e.g. 4x100x100", part)
		}
		var n [3]int
		for i, s := range f {
			v, err := strconv.Atoi(s)
			if err != nil || v < 1 {
				return nil, fmt.Errorf("processor variant %q: %q is not a positive number", part, s)
			}
			n[i] = v
		}
		out = append(out, shape{n[0], n[1], n[2], merge})
	}
	return out, nil
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "river bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) (err error) {
	fs := flag.NewFlagSet("river", flag.ContinueOnError)
	var cfg config
	var shapes string
	fs.StringVar(&cfg.adminURL, "database", os.Getenv("TEST_DATABASE_URL"), "admin connection string of the server (a database is created next to it)")
	fs.IntVar(&cfg.jobs, "jobs", 200_000, "due messages (jobs) per drain")
	fs.IntVar(&cfg.rounds, "rounds", 3, "rounds; each drains once with River and once with each Processor variant, alternating which goes first")
	fs.DurationVar(&cfg.work, "work", 0, "time every job and handler call sleeps (0: returns at once)")
	fs.IntVar(&cfg.riverWorkers, "river-workers", 2_000, "River's MaxWorkers (riverbench uses 2,000)")
	fs.IntVar(&cfg.conns, "conns", 0, "connections per pool (0: pgxpool's default)")
	fs.StringVar(&shapes, "processors", "4x100x100,4x100x100m,1x2000x1000", "Processor variants, processors x concurrency x batch, comma separated; a trailing m sets MergeCompletions")
	fs.DurationVar(&cfg.timeout, "drain-timeout", 10*time.Minute, "the longest one drain may take")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if cfg.adminURL == "" {
		return errors.New("-database (or $TEST_DATABASE_URL) is required")
	}
	if cfg.jobs < 1 || cfg.rounds < 1 || cfg.riverWorkers < 1 {
		return errors.New("-jobs, -rounds and -river-workers must be positive")
	}
	if cfg.processors, err = parseShapes(shapes); err != nil {
		return err
	}

	name := fmt.Sprintf("leasestore_river_bench_%d", os.Getpid())
	dbURL, err := pgadmin.CreateDatabase(ctx, cfg.adminURL, name, "")
	if err != nil {
		return fmt.Errorf("create database: %w", err)
	}
	defer func() {
		if dropErr := pgadmin.DropDatabase(cfg.adminURL, name); dropErr != nil && err == nil {
			err = fmt.Errorf("drop database %s: %w", name, dropErr)
		}
	}()
	pool, err := openPool(ctx, dbURL, cfg.conns)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := db.MigrateUp(ctx, pool); err != nil {
		return fmt.Errorf("migrate leasestore: %w", err)
	}
	migrator, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrate river: %w", err)
	}

	fmt.Fprintf(out, "%d jobs per drain, work %s, River MaxWorkers %d, %d rounds\n", cfg.jobs, cfg.work, cfg.riverWorkers, cfg.rounds)
	names := []string{fmt.Sprintf("river %d workers", cfg.riverWorkers)}
	for _, s := range cfg.processors {
		names = append(names, s.String())
	}
	rates := make([][]float64, cfg.rounds)
	for round := range cfg.rounds {
		rates[round] = make([]float64, len(names))
		order := make([]int, len(names))
		for i := range order {
			order[i] = i
			if round%2 == 1 {
				order[i] = len(names) - 1 - i
			}
		}
		for _, v := range order {
			dctx, cancel := context.WithTimeout(ctx, cfg.timeout)
			var took time.Duration
			if v == 0 {
				took, err = drainRiver(dctx, pool, cfg)
			} else {
				took, err = drainProcessors(dctx, pool, cfg, cfg.processors[v-1])
			}
			cancel()
			if err != nil {
				return fmt.Errorf("round %d, %s: %w", round+1, names[v], err)
			}
			rates[round][v] = float64(cfg.jobs) / took.Seconds()
			fmt.Fprintf(out, "round %d  %-28s %9.0f msgs/s  (%s)\n", round+1, names[v], rates[round][v], took.Round(time.Millisecond))
		}
	}
	fmt.Fprintf(out, "\n%-28s", "ratio to River, per round")
	for round := range cfg.rounds {
		fmt.Fprintf(out, "  round %d", round+1)
	}
	fmt.Fprintln(out)
	for v := 1; v < len(names); v++ {
		fmt.Fprintf(out, "%-28s", names[v])
		for round := range cfg.rounds {
			fmt.Fprintf(out, "  %6.2fx", rates[round][v]/rates[round][0])
		}
		fmt.Fprintln(out)
	}
	return nil
}

// openPool connects to dbURL with conns connections (0: pgxpool's
// default), with leasestore's binary uuids (leasing.RegisterTypes).
func openPool(ctx context.Context, dbURL string, conns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	if conns > 0 {
		cfg.MaxConns = int32(conns)
	}
	cfg.AfterConnect = leasing.RegisterTypes
	return pgxpool.NewWithConfig(ctx, cfg)
}

// benchArgs is riverbench's job: a number.
type benchArgs struct {
	Num int `json:"num"`
}

func (benchArgs) Kind() string { return "benchmark" }

// benchWorker works a job by sleeping work.
type benchWorker struct {
	river.WorkerDefaults[benchArgs]
	work time.Duration
}

func (w *benchWorker) Work(ctx context.Context, _ *river.Job[benchArgs]) error {
	return sleep(ctx, w.work)
}

// sleep waits d (nothing for 0) or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// drainRiver inserts cfg.jobs River jobs (off the clock) and times a River
// client in riverbench's configuration from Start to the last completion.
func drainRiver(ctx context.Context, pool *pgxpool.Pool, cfg config) (time.Duration, error) {
	if _, err := pool.Exec(ctx, "TRUNCATE river_job"); err != nil {
		return 0, err
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, &benchWorker{work: cfg.work})
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		FetchCooldown:     2 * time.Millisecond,
		FetchPollInterval: 20 * time.Millisecond,
		Queues:            map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: cfg.riverWorkers}},
		Workers:           workers,
	})
	if err != nil {
		return 0, err
	}
	params := make([]river.InsertManyParams, 0, 5_000)
	for n := 0; n < cfg.jobs; {
		params = params[:0]
		for ; len(params) < cap(params) && n < cfg.jobs; n++ {
			params = append(params, river.InsertManyParams{Args: benchArgs{Num: n}})
		}
		if _, err := client.InsertMany(ctx, params); err != nil {
			return 0, fmt.Errorf("insert jobs: %w", err)
		}
	}
	// Every drain starts from a vacuumed and analysed table.
	if _, err := pool.Exec(ctx, "VACUUM (ANALYZE) river_job"); err != nil {
		return 0, err
	}
	events, cancel := client.SubscribeConfig(&river.SubscribeConfig{
		ChanSize: cfg.jobs,
		Kinds:    []river.EventKind{river.EventKindJobCompleted, river.EventKindJobFailed, river.EventKindJobCancelled},
	})
	defer cancel()
	start := time.Now()
	if err := client.Start(ctx); err != nil {
		return 0, err
	}
	defer func() { _ = client.Stop(context.WithoutCancel(ctx)) }()
	for done := 0; done < cfg.jobs; {
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("%d of %d jobs completed: %w", done, cfg.jobs, ctx.Err())
		case e := <-events:
			if e == nil {
				return 0, errors.New("river closed the subscription")
			}
			if e.Kind != river.EventKindJobCompleted {
				return 0, fmt.Errorf("job %d: %s", e.Job.ID, e.Kind)
			}
			done++
		}
	}
	return time.Since(start), nil
}

// drainProcessors fills cfg.jobs due inbox messages (off the clock) and
// times s.processors Processors on pool from Run to every Run returned
// after the last handler call, then checks that every message completed.
func drainProcessors(ctx context.Context, pool *pgxpool.Pool, cfg config, s shape) (time.Duration, error) {
	if _, err := pool.Exec(ctx, "TRUNCATE inbox_messages, inbox_ordering_keys"); err != nil {
		return 0, err
	}
	if _, err := pool.Exec(ctx, `
		INSERT INTO inbox_messages (message_id, message_type, payload, created_at, visible_after)
		SELECT gen_random_uuid(), 'benchmark', '{"num":1}', c, c
		FROM (SELECT now() - interval '1 day' + g * interval '1 microsecond' AS c
		      FROM generate_series(1, $1::int) AS g) AS s`, cfg.jobs); err != nil {
		return 0, fmt.Errorf("fill: %w", err)
	}
	if _, err := pool.Exec(ctx, "VACUUM (ANALYZE) inbox_messages"); err != nil {
		return 0, err
	}
	took, err := bench.RunProcessors(ctx, pool, leasing.Inbox, bench.ProcessorDrain{
		Processors: s.processors, Concurrency: s.concurrency, BatchSize: s.batch,
		Options: processor.Options{PollInterval: 10 * time.Millisecond, MergeCompletions: s.merge},
		Work:    func(ctx context.Context) error { return sleep(ctx, cfg.work) },
	}, int64(cfg.jobs))
	if err != nil {
		return 0, err
	}
	var left int64
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM inbox_messages WHERE status <> 'completed'").Scan(&left); err != nil {
		return 0, err
	}
	if left != 0 {
		return 0, fmt.Errorf("%d messages not completed", left)
	}
	return took, nil
}
