// Package bench measures a leasestore queue on a database it creates: it
// fills the queue with a backlog of a chosen shape, drains it with several
// workers through the leasing API, verifies that every message was
// completed exactly once, and compares the rate with the same claim and
// complete statements driven by pgbench (the raw-SQL baseline). While the
// drain runs it samples the claim's plan cost, to show whether claims stay
// cheap as dead rows pile up.
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/db"
	"github.com/leasestore/leasestore/internal/explain"
	"github.com/leasestore/leasestore/internal/plural"
	"github.com/leasestore/leasestore/leasing"
)

// Run creates a database next to cfg.AdminURL, migrates and fills it, and
// drains it as cfg says: first through the leasing API, then (unless
// cfg.SkipRaw) refilled the same way and drained by pgbench, cfg.Rounds
// times. It writes the report, as text or JSON, to out and drops the
// database unless cfg.Keep.
//
// A drain that fails verification is reported in Result, not as an error.
//
// Errors: a bad cfg; a failed database step; pgbench failing to run.
func Run(ctx context.Context, cfg Config, out io.Writer) (res Result, err error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return Result{}, err
	}
	res = Result{
		Queue: string(cfg.Queue), Messages: cfg.Messages, TerminalRows: cfg.TerminalRows,
		DeferredRows: cfg.DeferredRows, ExpiredLeases: cfg.ExpiredLeases,
		Drained: cfg.Messages + cfg.ExpiredLeases, Workers: cfg.Workers, BatchSize: cfg.BatchSize,
		ExplainBatch: cfg.ExplainBatch, TopicRows: cfg.TopicRows, RegisteredTypes: !cfg.PlainPgx, OrderingKeys: cfg.OrderingKeys,
		MergedCompletions: cfg.MergeCompletions,
	}
	name, dbURL, drop, err := runDatabase(ctx, cfg)
	if err != nil {
		return res, err
	}
	res.Database, res.Kept = name, cfg.Keep
	defer drop(&err)
	err = run(ctx, cfg, dbURL, &res)
	if err != nil {
		return res, err
	}
	if cfg.JSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		err = enc.Encode(res)
	} else {
		err = writeText(out, res, dbURL)
	}
	return res, err
}

// openStore connects to dbURL with a pool of maxConns connections (0:
// pgxpool's default), migrates the schema up and returns queue q's store.
// Close its Pool when done.
func openStore(ctx context.Context, dbURL string, maxConns int32, q leasing.Queue) (*leasing.Postgres, error) {
	poolCfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	if maxConns > 0 {
		poolCfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return nil, fmt.Errorf("bench: connect: %w", err)
	}
	store, err := leasing.NewPostgres(pool, q, leasing.PostgresOptions{})
	if err == nil {
		_, err = db.MigrateUp(ctx, pool)
	}
	if err != nil {
		pool.Close()
		return nil, err
	}
	return store, nil
}

func run(ctx context.Context, cfg Config, dbURL string, res *Result) error {
	store, err := openStore(ctx, dbURL, 0, cfg.Queue)
	if err != nil {
		return err
	}
	pool := store.Pool()
	defer pool.Close()
	t := tableOf(cfg.Queue)
	progress := newProgress(cfg.Progress)

	start := time.Now()
	progress.status("filling %s: %d due, %d terminal, %d deferred, %d expired", t.name,
		cfg.Messages, cfg.TerminalRows, cfg.DeferredRows, cfg.ExpiredLeases)
	if err := fill(ctx, pool, t, cfg, 0); err != nil {
		return err
	}
	res.FillSeconds = time.Since(start).Seconds()
	res.Clean, err = cleanCost(ctx, store, explain.Claim, cfg.ExplainBatch, explain.Options{})
	if err != nil {
		return err
	}
	res.CleanGeneric, err = cleanCost(ctx, store, explain.ClaimGeneric, cfg.ExplainBatch, explain.Options{})
	if err != nil {
		return err
	}
	if cfg.TopicRows > 0 {
		progress.status("filling %s: %d due of topic %s behind the rest", t.name, cfg.TopicRows, kindTopic)
		if err := fillTopic(ctx, pool, t, cfg); err != nil {
			return err
		}
		scoped := explain.Options{Topics: []string{kindTopic}}
		topic, err := cleanCost(ctx, store, explain.Claim, cfg.ExplainBatch, scoped)
		if err != nil {
			return err
		}
		generic, err := cleanCost(ctx, store, explain.ClaimGeneric, cfg.ExplainBatch, scoped)
		if err != nil {
			return err
		}
		res.Topic, res.TopicGeneric = &topic, &generic
	}
	progress.done()
	if cfg.SkipDrain {
		return nil
	}

	pgbench, why := "", "turned off"
	if cfg.OrderingKeys > 0 {
		// Keyed against unkeyed drains, each unpaused by samples.
		cfg.SkipRaw, cfg.SampleEvery, why = true, -1, "--ordering-keys compares keyed with unkeyed drains"
	}
	if !cfg.SkipRaw {
		pgbench, why = findPgbench(cfg.Pgbench)
	}
	if pgbench == "" {
		res.RawSkipped = why
	}
	refill := func(what string, keys int) error {
		progress.status("refilling %s for %s", t.name, what)
		if err := truncate(ctx, pool, t); err != nil {
			return err
		}
		if err := fill(ctx, pool, t, cfg, keys); err != nil {
			return err
		}
		progress.done()
		return nil
	}
	// Claim-cost samples pause the workers: a drain compared with pgbench
	// never samples, so with the baseline on the sampled drain runs first,
	// on its own.
	sampleApart := pgbench != "" && cfg.SampleEvery > 0
	if sampleApart {
		d, steady, err := drainAPI(ctx, cfg, dbURL, pool, t, res.Clean.Buffers, progress)
		if err != nil {
			return err
		}
		res.Sampled, res.Steady = &d, steady
	}
	var ratios, procRatios, keyedRatios []float64
	for i := range cfg.Rounds {
		roundCfg := cfg
		if i > 0 || sampleApart {
			roundCfg.SampleEvery = -1
			if err := refill(fmt.Sprintf("round %d of %d", i+1, cfg.Rounds), 0); err != nil {
				return err
			}
		}
		api, steady, err := drainAPI(ctx, roundCfg, dbURL, pool, t, res.Clean.Buffers, progress)
		if err != nil {
			return err
		}
		round := Round{API: &api}
		if i == 0 {
			res.API = &api
			if !sampleApart {
				res.Steady = steady
			}
		}
		if pgbench != "" {
			if err := refill(fmt.Sprintf("pgbench, round %d of %d", i+1, cfg.Rounds), 0); err != nil {
				return err
			}
			raw, err := drainPgbench(ctx, cfg, pgbench, dbURL, pool, t, progress)
			if err != nil {
				return err
			}
			round.Raw = &raw
			if raw.MessagesPerSecond > 0 {
				round.APIVsRaw = api.MessagesPerSecond / raw.MessagesPerSecond
				ratios = append(ratios, round.APIVsRaw)
			}
			if i == 0 {
				res.Raw = &raw
			}
		}
		if cfg.Processors {
			if err := refill(fmt.Sprintf("processors, round %d of %d", i+1, cfg.Rounds), 0); err != nil {
				return err
			}
			proc, err := drainProcessors(ctx, cfg, dbURL, pool, t, progress)
			if err != nil {
				return err
			}
			round.Processor = &proc
			if round.Raw != nil && round.Raw.MessagesPerSecond > 0 {
				round.ProcessorVsRaw = proc.MessagesPerSecond / round.Raw.MessagesPerSecond
				procRatios = append(procRatios, round.ProcessorVsRaw)
			}
		}
		if cfg.OrderingKeys > 0 {
			if err := refill(fmt.Sprintf("%d ordering keys, round %d of %d", cfg.OrderingKeys, i+1, cfg.Rounds), cfg.OrderingKeys); err != nil {
				return err
			}
			keyed, _, err := drainAPI(ctx, cfg, dbURL, pool, t, res.Clean.Buffers, progress)
			if err != nil {
				return err
			}
			keyed.Method = "keyed"
			if keyed.Verified {
				n, err := outOfOrder(ctx, pool, t)
				if err != nil {
					return err
				}
				if n > 0 {
					keyed.Verified, keyed.Problem = false, plural.Count(n, "message", "messages")+" completed before the message ahead in its key"
				}
			}
			round.Keyed = &keyed
			round.KeyedVsUnkeyed = keyed.MessagesPerSecond / api.MessagesPerSecond
			keyedRatios = append(keyedRatios, round.KeyedVsUnkeyed)
		}
		res.Rounds = append(res.Rounds, round)
	}
	res.APIVsRaw = median(ratios)
	res.ProcessorVsRaw = median(procRatios)
	res.KeyedVsUnkeyed = median(keyedRatios)
	return nil
}

// cleanCost returns the median cost of five rolled-back claims of batch
// rows on store's queue, explained by run (explain.Claim or ClaimGeneric).
func cleanCost(ctx context.Context, store *leasing.Postgres, run func(context.Context, *pgxpool.Pool, leasing.Queue, int, explain.Options) (explain.ClaimPlan, error), batch int, opts explain.Options) (ClaimCost, error) {
	plans := make([]explain.ClaimPlan, 5)
	for i := range plans {
		p, err := run(ctx, store.Pool(), store.Queue(), batch, opts)
		if err != nil {
			return ClaimCost{}, err
		}
		plans[i] = p
	}
	slices.SortFunc(plans, func(a, b explain.ClaimPlan) int { return int(a.Buffers - b.Buffers) })
	return costOf(plans[len(plans)/2], true), nil
}
