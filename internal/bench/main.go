package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/leasestore/leasestore/internal/pgadmin"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// Main runs the bench command line args (flags only, without the command
// name) against the server of adminURL and returns the exit status: 0 when
// every drain verified, 1 when one failed verification or the run failed,
// 2 for bad flags. The progress line goes to stderr when it is a terminal.
func Main(ctx context.Context, adminURL string, args []string, stdout, stderr io.Writer, extra ...func(*flag.FlagSet)) int {
	cfg, err := ParseFlags(args, stderr, extra...)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		return 2
	}
	cfg.AdminURL = adminURL
	if f, ok := stderr.(*os.File); ok && IsTerminal(f) && !cfg.JSON {
		cfg.Progress = stderr
	}
	if cfg.Producers > 0 {
		cfg = cfg.withDefaults()
		if _, err := runProducers(ctx, cfg, stdout); err != nil {
			fmt.Fprintln(stderr, prefixed(err))
			return 1
		}
		return 0
	}
	res, err := Run(ctx, cfg, stdout)
	if err != nil {
		fmt.Fprintln(stderr, prefixed(err))
		return 1
	}
	for _, d := range res.Drains() {
		if !d.Verified {
			fmt.Fprintf(stderr, "bench: %s drain failed verification: %s\n", d.Method, d.Problem)
			return 1
		}
	}
	return 0
}

// ParseFlags parses the bench flags into a Config (AdminURL left empty),
// and those each of extra registers (leasectl's --database-url, which it
// parses before, so that the usage lists it). Usage and errors go to
// stderr.
//
// Errors: flag.ErrHelp for -h; the flag package's error for bad flags.
func ParseFlags(args []string, stderr io.Writer, extra ...func(*flag.FlagSet)) (Config, error) {
	var cfg Config
	var queue string
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	for _, register := range extra {
		register(fs)
	}
	fs.StringVar(&queue, "queue", "inbox", "queue to measure: inbox or outbox")
	fs.IntVar(&cfg.Messages, "messages", 200_000, "due pending messages to drain")
	fs.IntVar(&cfg.TerminalRows, "terminal", 0, "finished rows in the table, older than the rest")
	fs.IntVar(&cfg.DeferredRows, "deferred", 0, "rows at the FIFO head that are not due for a day")
	fs.IntVar(&cfg.ExpiredLeases, "expired", 0, "in-flight rows whose lease has expired (drained too)")
	fs.IntVar(&cfg.PayloadBytes, "payload-bytes", 64, "payload size of each message in bytes")
	fs.IntVar(&cfg.Workers, "workers", 4, "draining workers, one connection each")
	fs.IntVar(&cfg.BatchSize, "batch", 100, "claim batch size (1 for one message per claim)")
	fs.DurationVar(&cfg.LeaseFor, "lease", 0, "lease duration of each claim (default 5m)")
	fs.IntVar(&cfg.ExplainBatch, "explain-batch", 10, "batch size of the claims whose plan cost is measured")
	fs.IntVar(&cfg.SampleEvery, "sample-every", 5_000, "messages between claim-cost samples during the drain; -1 for none")
	fs.Int64Var(&cfg.Vacuum.DeadRows, "vacuum-dead-rows", processor.DefaultVacuumDeadRows, "vacuum policy of both drains: VACUUM the table at this many dead rows, as processors do")
	fs.BoolVar(&cfg.Vacuum.Disabled, "no-vacuum", false, "turn the vacuum policy off during the drains: autovacuum alone cleans up")
	fs.BoolVar(&cfg.Processors, "processors", false, "also drain, each round, with --workers processors (processor.New) on one pool of --workers connections, each with Concurrency and BatchSize --batch, and compare them with pgbench")
	fs.BoolVar(&cfg.MergeCompletions, "merge-completions", false, "with --processors: the processors send their completions with their next claims (processor.Options.MergeCompletions)")
	fs.BoolVar(&cfg.TwoRoundTrips, "two-round-trips", false, "claim and complete with separate calls instead of one CompleteAndClaim per batch")
	fs.BoolVar(&cfg.PlainPgx, "plain-pgx", false, "do not register leasing.RegisterTypes on the workers' connections")
	fs.BoolVar(&cfg.SkipDrain, "fill-only", false, "fill and measure a clean claim, then stop")
	fs.IntVar(&cfg.TopicRows, "topic-rows", 0, "with --fill-only: add this many due rows of topic bench-topic behind the fill and measure a claim scoped to that topic beside the unscoped one")
	fs.BoolVar(&cfg.SkipRaw, "no-raw", false, "skip the pgbench baseline")
	fs.IntVar(&cfg.OrderingKeys, "ordering-keys", 0, "compare, in each round, the unkeyed drain with a drain of as many messages over this many ordering keys (no pgbench baseline, no samples)")
	fs.IntVar(&cfg.Rounds, "rounds", 1, "API and pgbench drain pairs to run alternately, each drain on a fresh fill; the ratio printed is their median (API drains only with --no-raw)")
	fs.StringVar(&cfg.Pgbench, "pgbench", "", "pgbench binary (default: PATH, else /usr/lib/postgresql/*/bin)")
	fs.BoolVar(&cfg.Keep, "keep", false, "keep the benchmark database instead of dropping it")
	fs.BoolVar(&cfg.JSON, "json", false, "print the result as JSON")
	fs.IntVar(&cfg.Producers, "producers", 0, "producer mode: this many producers commit one message per transaction; measures the work signal's cost (with vs without) and pickup latency instead of a drain")
	fs.Func("rate", "producer mode: combined rate in messages/s of a pickup phase; repeat or comma-separate (default 100,1000; a last phase always runs at full speed)", func(v string) error {
		for _, f := range strings.Split(v, ",") {
			r, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || r < 1 {
				return fmt.Errorf("want a positive integer, got %q", f)
			}
			cfg.Rates = append(cfg.Rates, r)
		}
		return nil
	})
	fs.DurationVar(&cfg.PhaseDuration, "phase", 10*time.Second, "producer mode: length of each phase")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: bench [flags]\n\n"+
			"Creates a database, fills it, drains it through the leasing API and with pgbench,\n"+
			"and reports messages/s, claim and complete latency and claim cost.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "bench: unexpected argument %q\n", fs.Arg(0))
		return Config{}, errors.New("bench: unexpected arguments")
	}
	// Zero means "the default" in a Config, but on the command line it is a
	// mistake: the flags show their defaults.
	for _, f := range []struct {
		name  string
		value int
	}{{"messages", cfg.Messages}, {"workers", cfg.Workers}, {"batch", cfg.BatchSize},
		{"explain-batch", cfg.ExplainBatch}, {"rounds", cfg.Rounds}, {"sample-every", cfg.SampleEvery},
		{"payload-bytes", cfg.PayloadBytes}} {
		if f.value == 0 {
			err := fmt.Errorf("bench: --%s must not be 0", f.name)
			fmt.Fprintln(stderr, err)
			return Config{}, err
		}
	}
	q, err := leasing.ParseQueue(queue)
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return Config{}, err
	}
	cfg.Queue = q
	if err := cfg.withDefaults().validateFlags(); err != nil {
		fmt.Fprintf(stderr, "%v\n", err)
		return Config{}, err
	}
	return cfg, nil
}

// validateFlags is validate without the database URL, which Main sets.
func (cfg Config) validateFlags() error {
	cfg.AdminURL = "-"
	return cfg.validate()
}

// prefixed returns err's text, a refused connection listed once, with the
// "bench: " prefix.
func prefixed(err error) string {
	msg := pgadmin.ErrorText(err)
	if !strings.HasPrefix(msg, "bench: ") {
		msg = "bench: " + msg
	}
	return msg
}
