package bench

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

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
	// TopicRows, when positive, adds as many due rows of topic
	// "bench-topic" behind the fill (every due row of the fill, of other
	// topics, ahead of them) and measures a claim scoped to that topic
	// (leasing.ClaimRequest.Topics) beside the unscoped one. Needs
	// SkipDrain: the drains' verification knows only the fill's rows.
	TopicRows int
	// SkipRaw skips the pgbench baseline.
	SkipRaw bool
	// Processors adds to each round a drain by Workers processors
	// (processor.New) sharing one pool of Workers connections, each with
	// Concurrency and BatchSize both BatchSize and a no-op handler,
	// compared with the round's pgbench drain. Defaults to false.
	Processors bool
	// MergeCompletions sets the processors' Options.MergeCompletions
	// (with Processors): their completions ride with their next claims.
	// Defaults to false, the processors' default.
	MergeCompletions bool
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
	case cfg.TopicRows < 0:
		return fmt.Errorf("bench: topic rows must not be negative, got %d", cfg.TopicRows)
	case cfg.TopicRows > 0 && !cfg.SkipDrain:
		return errors.New("bench: topic rows need fill only (--fill-only)")
	case cfg.MergeCompletions && !cfg.Processors:
		return errors.New("bench: merged completions need processors (--processors)")
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
