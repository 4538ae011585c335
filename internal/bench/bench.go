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
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/db"
	"github.com/leasestore/leasestore/internal/explain"
	"github.com/leasestore/leasestore/internal/plural"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// Config says what to fill and how to drain it. Zero fields take their
// defaults.
type Config struct {
	// AdminURL is a connection string to the server's maintenance database;
	// Run creates its own database, leasestore_bench_<random>, next to it.
	AdminURL string
	// Queue is the queue to measure. Defaults to leasing.Inbox.
	Queue leasing.Queue
	// Messages is the number of due pending rows to drain. Defaults to 200,000.
	Messages int
	// TerminalRows is the number of finished rows (completed or published)
	// in the table, older than every other row. Defaults to 0.
	TerminalRows int
	// DeferredRows is the number of pending rows at the FIFO head that are
	// not due for a day: every claim must pass them. Defaults to 0.
	DeferredRows int
	// ExpiredLeases is the number of in-flight rows whose lease expired a
	// minute ago; the drain reclaims and completes them too. Defaults to 0.
	ExpiredLeases int
	// PayloadBytes is the size of each payload in bytes. Defaults to 64.
	PayloadBytes int
	// Workers is the number of draining workers, each on its own
	// connection. Defaults to 4.
	Workers int
	// BatchSize is the claim batch size; each batch is completed whole, in
	// the same CompleteAndClaim call that claims the next. Defaults to 100.
	BatchSize int
	// LeaseFor is the lease duration of each claim. Defaults to 5 minutes,
	// so that no lease expires during a drain.
	LeaseFor time.Duration
	// ExplainBatch is the batch size of the claims whose plan cost Run
	// measures after the fill and during the drain. Defaults to 10.
	ExplainBatch int
	// SampleEvery is how many drained messages pass between two plan-cost
	// samples during the leasing drain; negative turns sampling off.
	// Defaults to 5,000.
	SampleEvery int
	// Vacuum is the vacuum policy both drains run on the table from a
	// connection of their own (processor.KeepVacuumed), as
	// processors do. Defaults to the processors' default: on.
	Vacuum processor.VacuumPolicy
	// TwoRoundTrips makes each leasing worker step a Complete call and then
	// a Claim call, as the raw-SQL loop does, instead of one
	// CompleteAndClaim call. Defaults to false.
	TwoRoundTrips bool
	// PlainPgx leaves the workers' connections as pgx makes them, without
	// leasing.RegisterTypes. Defaults to false: registered, as recommended.
	PlainPgx bool
	// SkipDrain stops after the fill and the plan of a clean claim.
	SkipDrain bool
	// SkipRaw skips the pgbench baseline.
	SkipRaw bool
	// Rounds is the number of API + pgbench drain pairs, run alternately,
	// each drain on a freshly filled table; the ratio reported is their
	// median. With SkipRaw the rounds are API drains only. Defaults to 1.
	Rounds int
	// Pgbench is the pgbench binary. Defaults to pgbench on PATH, else the
	// newest /usr/lib/postgresql/*/bin/pgbench.
	Pgbench string
	// Keep leaves the database in place after the run instead of dropping it.
	Keep bool
	// JSON writes the Result as JSON to the output instead of a text report.
	JSON bool
	// OrderingKeys, when > 0, compares drains of keyed and unkeyed
	// messages in the same run: each round drains Messages unkeyed rows,
	// then Messages rows over this many ordering keys (each key's line in
	// created_at order), on freshly filled tables, and the ratio reported
	// is keyed messages/s over unkeyed, the median over the rounds. The
	// pgbench baseline and the claim-cost samples are off in this mode.
	// Defaults to 0: unkeyed only.
	OrderingKeys int
	// Producers, when > 0, switches to the producer mode (see
	// producers.go): this many producers, one message per transaction,
	// measure the work signal's cost and pickup latency instead of a
	// drain. Defaults to 0: the drain.
	Producers int
	// Rates are the producers' combined rates, messages/s, of the pickup
	// phases; a last phase runs unthrottled. Producer mode only. Defaults
	// to 100 and 1,000.
	Rates []int
	// PhaseDuration is the length of each producer-mode phase. Defaults
	// to 10 seconds.
	PhaseDuration time.Duration
	// Progress, when not nil, receives a progress line rewritten in place
	// with \r (meant for a terminal: see IsTerminal). Defaults to none.
	Progress io.Writer
}

// withDefaults returns cfg with its zero fields set.
func (cfg Config) withDefaults() Config {
	if cfg.Queue == "" {
		cfg.Queue = leasing.Inbox
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&cfg.Messages, 200_000)
	def(&cfg.PayloadBytes, 64)
	def(&cfg.Workers, 4)
	def(&cfg.BatchSize, 100)
	def(&cfg.ExplainBatch, 10)
	def(&cfg.SampleEvery, 5_000)
	def(&cfg.Rounds, 1)
	if cfg.LeaseFor == 0 {
		cfg.LeaseFor = 5 * time.Minute
	}
	if cfg.Producers > 0 && cfg.Rates == nil {
		cfg.Rates = []int{100, 1000}
	}
	if cfg.PhaseDuration == 0 {
		cfg.PhaseDuration = 10 * time.Second
	}
	return cfg
}

func (cfg Config) validate() error {
	if _, err := leasing.ParseQueue(string(cfg.Queue)); err != nil {
		return err
	}
	switch {
	case cfg.AdminURL == "":
		return errors.New("bench: no database URL")
	case cfg.Messages < 1:
		return fmt.Errorf("bench: messages must be at least 1, got %d", cfg.Messages)
	case cfg.TerminalRows < 0 || cfg.DeferredRows < 0 || cfg.ExpiredLeases < 0:
		return errors.New("bench: terminal, deferred and expired row counts must not be negative")
	case cfg.PayloadBytes < 0 || cfg.PayloadBytes > leasing.MaxPayloadBytes:
		return fmt.Errorf("bench: payload bytes must be 0..%d, got %d", leasing.MaxPayloadBytes, cfg.PayloadBytes)
	case cfg.Workers < 1 || cfg.Workers > 64:
		return fmt.Errorf("bench: workers must be 1..64, got %d", cfg.Workers)
	case cfg.BatchSize < 1 || cfg.BatchSize > leasing.MaxBatchSize:
		return fmt.Errorf("bench: batch size must be 1..%d, got %d", leasing.MaxBatchSize, cfg.BatchSize)
	case cfg.ExplainBatch < 1 || cfg.ExplainBatch > leasing.MaxBatchSize:
		return fmt.Errorf("bench: explain batch must be 1..%d, got %d", leasing.MaxBatchSize, cfg.ExplainBatch)
	case cfg.Rounds < 1 || cfg.Rounds > 20:
		return fmt.Errorf("bench: rounds must be 1..20, got %d", cfg.Rounds)
	case cfg.OrderingKeys < 0 || cfg.OrderingKeys > cfg.Messages:
		return fmt.Errorf("bench: ordering keys must be 0..messages (%d), got %d", cfg.Messages, cfg.OrderingKeys)
	case cfg.Producers < 0 || cfg.Producers > 256:
		return fmt.Errorf("bench: producers must be 0..256, got %d", cfg.Producers)
	case slices.ContainsFunc(cfg.Rates, func(r int) bool { return r < 1 }):
		return fmt.Errorf("bench: rates must be at least 1 message/s, got %v", cfg.Rates)
	case cfg.PhaseDuration < time.Second:
		return fmt.Errorf("bench: phase duration must be at least 1s, got %s", cfg.PhaseDuration)
	case cfg.LeaseFor < time.Second || cfg.LeaseFor > leasing.MaxLeaseDuration:
		return fmt.Errorf("bench: lease must be 1s..%s, got %s", leasing.MaxLeaseDuration, cfg.LeaseFor)
	}
	return nil
}

// Result is what a Run measured. Durations are in the unit their name says.
type Result struct {
	// Database is the database Run created; Kept says whether it is still there.
	Database string `json:"database"`
	Kept     bool   `json:"kept"`
	// Queue, Messages ... ExplainBatch echo the configuration. Drained is
	// the number of rows a drain must finish: Messages + ExpiredLeases.
	Queue         string `json:"queue"`
	Messages      int    `json:"messages"`
	TerminalRows  int    `json:"terminal_rows"`
	DeferredRows  int    `json:"deferred_rows"`
	ExpiredLeases int    `json:"expired_leases"`
	Drained       int    `json:"drained"`
	Workers       int    `json:"workers"`
	BatchSize     int    `json:"batch_size"`
	ExplainBatch  int    `json:"explain_batch"`
	// RegisteredTypes says whether the workers' connections ran
	// leasing.RegisterTypes.
	RegisteredTypes bool `json:"registered_types"`
	// FillSeconds is the time the fill, VACUUM and ANALYZE took.
	FillSeconds float64 `json:"fill_seconds"`
	// Clean is the plan cost of a claim of ExplainBatch rows right after
	// the fill: the median of several rolled-back claims.
	Clean ClaimCost `json:"clean_claim"`
	// CleanGeneric is the same for the claim's generic plan (see
	// explain.ClaimGeneric).
	CleanGeneric ClaimCost `json:"clean_generic_claim"`
	// Sampled is the API drain the claim-cost samples (Steady) were taken
	// in, when it ran on its own before the rounds: it does when the
	// pgbench baseline runs, because the samples pause the drain's workers
	// and would handicap it against pgbench. Its rate is not compared. Nil
	// otherwise: the first round's API drain samples.
	Sampled *Drain `json:"sampled,omitempty"`
	// API is the first round's drain through the leasing API; nil with
	// SkipDrain.
	API *Drain `json:"api,omitempty"`
	// Raw is the first round's pgbench drain of the same statements; nil
	// when skipped.
	Raw *Drain `json:"raw,omitempty"`
	// Rounds holds every round's drains, in the order they ran (the first
	// is API and Raw again).
	Rounds []Round `json:"rounds,omitempty"`
	// APIVsRaw is API messages/s divided by raw messages/s, the median over
	// the rounds (the mean of the middle two for an even count); 0 without
	// both drains.
	APIVsRaw float64 `json:"api_vs_raw,omitempty"`
	// Steady is the claim cost sampled during Sampled, or during the first
	// round's API drain; nil when sampling is off or the drain was skipped.
	Steady *Steady `json:"steady_state,omitempty"`
	// RawSkipped says why the raw baseline did not run, if it did not.
	RawSkipped string `json:"raw_skipped,omitempty"`
	// OrderingKeys echoes Config.OrderingKeys; KeyedVsUnkeyed is keyed
	// messages/s over unkeyed, the median over the rounds (0 without keys).
	OrderingKeys   int     `json:"ordering_keys,omitempty"`
	KeyedVsUnkeyed float64 `json:"keyed_vs_unkeyed,omitempty"`
}

// Round is one API drain and the pgbench drain after it, each on a freshly
// filled table.
type Round struct {
	// API is the drain through the leasing API.
	API *Drain `json:"api"`
	// Raw is nil when the baseline was skipped.
	Raw *Drain `json:"raw,omitempty"`
	// APIVsRaw is API messages/s divided by Raw messages/s; 0 without Raw.
	APIVsRaw float64 `json:"api_vs_raw,omitempty"`
	// Keyed is the drain of keyed messages after API (OrderingKeys), and
	// KeyedVsUnkeyed its messages/s over API's; nil and 0 without keys.
	Keyed          *Drain  `json:"keyed,omitempty"`
	KeyedVsUnkeyed float64 `json:"keyed_vs_unkeyed,omitempty"`
}

// Drains returns every drain of res, API and pgbench, in the order they ran.
func (res Result) Drains() []*Drain {
	var out []*Drain
	if res.Sampled != nil {
		out = append(out, res.Sampled)
	}
	for _, r := range res.Rounds {
		out = append(out, r.API)
		if r.Raw != nil {
			out = append(out, r.Raw)
		}
		if r.Keyed != nil {
			out = append(out, r.Keyed)
		}
	}
	return out
}

// ClaimCost is the plan cost of one claim (see explain.ClaimPlan).
type ClaimCost struct {
	Rows             int      `json:"claim_rows"`
	Buffers          int64    `json:"claim_buffers"`
	Ms               float64  `json:"claim_ms"`
	TempBlocks       int64    `json:"temp_blocks"`
	JIT              bool     `json:"jit"`
	SeqScan          bool     `json:"seq_scan"`
	SortOverEligible bool     `json:"sort_over_eligible"`
	Plan             []string `json:"claim_plan,omitempty"`
}

func costOf(p explain.ClaimPlan, withPlan bool) ClaimCost {
	c := ClaimCost{
		Rows: p.Rows, Buffers: p.Buffers, Ms: ms(p.Duration), TempBlocks: p.TempBlocks,
		JIT: p.JIT, SeqScan: p.SeqScan, SortOverEligible: p.SortOverEligible,
	}
	if withPlan {
		c.Plan = p.Nodes
	}
	return c
}

// Drain is one drain's throughput and latency. Latencies are per call, in
// milliseconds, as the client saw them.
type Drain struct {
	// Method is "leasing" (the Go API) or "pgbench" (raw SQL).
	Method            string  `json:"method"`
	Seconds           float64 `json:"seconds"`
	MessagesPerSecond float64 `json:"messages_per_second"`
	// Claims counts claim calls, EmptyClaims those that returned no row.
	Claims      int `json:"claims"`
	EmptyClaims int `json:"empty_claims"`
	// RoundTrips is the leasing drain's round trips per batch: 1 when
	// each step was one CompleteAndClaim call, 2 with Config.TwoRoundTrips.
	RoundTrips int `json:"round_trips,omitempty"`
	// ClaimP50Ms ... CompleteAndClaimP99Ms are leasing only: Claim and
	// Complete calls made on their own (with TwoRoundTrips, and the first
	// claim and last complete of each worker), and CompleteAndClaim calls.
	ClaimP50Ms            float64 `json:"claim_p50_ms,omitempty"`
	ClaimP99Ms            float64 `json:"claim_p99_ms,omitempty"`
	CompleteP50Ms         float64 `json:"complete_p50_ms,omitempty"`
	CompleteP99Ms         float64 `json:"complete_p99_ms,omitempty"`
	CompleteAndClaimP50Ms float64 `json:"complete_and_claim_p50_ms,omitempty"`
	CompleteAndClaimP99Ms float64 `json:"complete_and_claim_p99_ms,omitempty"`
	// LoopAvgMs is pgbench's average latency of one claim + complete loop.
	LoopAvgMs float64 `json:"loop_avg_ms,omitempty"`
	// ClientCPUSeconds is the CPU time (user + system, seconds) of the
	// draining client. For leasing it is this whole process from the
	// workers' start to their end, the pools already connected: the
	// workers, the vacuum policy's loop, the progress line, the claim-cost
	// sampler when it runs, and garbage collection, also of garbage left
	// by the fill (and anything else the process runs meanwhile, e.g.
	// parallel tests). For pgbench it is the pgbench process's whole life,
	// its connecting included, which Seconds leaves out. On a machine
	// whose cores the client shares with the server, it is CPU the server
	// did not get. 0 where the system does not report it.
	ClientCPUSeconds float64 `json:"client_cpu_seconds,omitempty"`
	// Autovacuums counts autovacuum runs on the table during the drain.
	Autovacuums int64 `json:"autovacuums"`
	// Vacuums counts the other VACUUMs of the table during the drain: the
	// vacuum policy's.
	Vacuums int64 `json:"vacuums"`
	// KeyVacuums counts the VACUUMs of the ordering keys' table during the
	// drain, autovacuum's left out: the vacuum policy's.
	KeyVacuums int64 `json:"key_vacuums"`
	// Verified is true when every row was completed exactly once and no
	// other row changed; Problem says what failed otherwise.
	Verified bool   `json:"verified"`
	Problem  string `json:"problem,omitempty"`
}

// Steady is the claim cost sampled during a drain.
type Steady struct {
	Samples []Sample `json:"samples"`
	// CleanBuffers is Result.Clean.Buffers; P50Buffers and MaxBuffers are
	// over the quiesced samples that claimed a full ExplainBatch, and
	// LiveP50Buffers and LiveMaxBuffers over the live ones.
	CleanBuffers   int64 `json:"clean_buffers"`
	P50Buffers     int64 `json:"p50_buffers"`
	MaxBuffers     int64 `json:"max_buffers"`
	LiveP50Buffers int64 `json:"live_p50_buffers"`
	LiveMaxBuffers int64 `json:"live_max_buffers"`
	// MaxRatio is MaxBuffers / CleanBuffers, LiveMaxRatio the same for the
	// live samples.
	MaxRatio     float64 `json:"max_ratio"`
	LiveMaxRatio float64 `json:"live_max_ratio"`
}

// Sample is one claim measured during a drain, twice: live, while the
// workers' claims run and it must skip the rows they lock, and quiesced,
// with the workers held between two batches, which shows the state of the
// table and its indexes alone.
type Sample struct {
	// Drained is how many messages the drain had finished.
	Drained int64 `json:"drained"`
	// Rows, Buffers and Ms are the quiesced claim's.
	Rows    int     `json:"claim_rows"`
	Buffers int64   `json:"claim_buffers"`
	Ms      float64 `json:"claim_ms"`
	// LiveRows, LiveBuffers and LiveMs are the live claim's.
	LiveRows    int     `json:"live_claim_rows"`
	LiveBuffers int64   `json:"live_claim_buffers"`
	LiveMs      float64 `json:"live_claim_ms"`
	// DeadTuples is the table's dead row estimate at the sample.
	DeadTuples int64 `json:"dead_tuples"`
	// Autovacuums and Vacuums are the table's autovacuum and other VACUUM
	// counts when the sample was taken.
	Autovacuums int64 `json:"autovacuums"`
	Vacuums     int64 `json:"vacuums"`
}

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
		ExplainBatch: cfg.ExplainBatch, RegisteredTypes: !cfg.PlainPgx, OrderingKeys: cfg.OrderingKeys,
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
	res.Clean, err = cleanCost(ctx, store, explain.Claim, cfg.ExplainBatch)
	if err != nil {
		return err
	}
	res.CleanGeneric, err = cleanCost(ctx, store, explain.ClaimGeneric, cfg.ExplainBatch)
	if err != nil {
		return err
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
	var ratios, keyedRatios []float64
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
	res.KeyedVsUnkeyed = median(keyedRatios)
	return nil
}

// median returns the median of xs (the mean of the middle two for an even
// count), or 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// cleanCost returns the median cost of five rolled-back claims of batch
// rows on store's queue, explained by run (explain.Claim or ClaimGeneric).
func cleanCost(ctx context.Context, store *leasing.Postgres, run func(context.Context, *pgxpool.Pool, leasing.Queue, int, explain.Options) (explain.ClaimPlan, error), batch int) (ClaimCost, error) {
	plans := make([]explain.ClaimPlan, 5)
	for i := range plans {
		p, err := run(ctx, store.Pool(), store.Queue(), batch, explain.Options{})
		if err != nil {
			return ClaimCost{}, err
		}
		plans[i] = p
	}
	slices.SortFunc(plans, func(a, b explain.ClaimPlan) int { return int(a.Buffers - b.Buffers) })
	return costOf(plans[len(plans)/2], true), nil
}

// percentileMs returns the q-quantile of lat in milliseconds (nearest rank).
func percentileMs(lat []time.Duration, q float64) float64 {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	return ms(s[min(max(i, 0), len(s)-1)])
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// IsTerminal reports whether f is a terminal (a character device), where
// a progress line rewritten with \r makes sense.
func IsTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
