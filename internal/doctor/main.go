package doctor

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/leasing"
)

// Main runs the doctor command line args (flags only, without the command
// name) on the database connect opens, once the flags parsed, and returns
// the exit status: 0 when healthy, 1 when a check found a problem or could
// not run (connect's error included), 2 for bad flags (nothing connected).
// Main closes the pool connect returns. Each of extra registers flags the
// caller parses before (leasectl's --database-url), so that the usage lists
// them.
func Main(ctx context.Context, connect func(context.Context) (*pgxpool.Pool, error), args []string, stdout, stderr io.Writer, extra ...func(*flag.FlagSet)) int {
	asJSON, opts, err := ParseFlags(args, stderr, extra...)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		return 2
	}
	pool, err := connect(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "doctor: %v\n", err)
		return 1
	}
	defer pool.Close()
	ok, err := Run(ctx, pool, stdout, asJSON, opts)
	if err != nil {
		// Most of Run's errors say "doctor: " already.
		fmt.Fprintln(stderr, "doctor: "+strings.TrimPrefix(err.Error(), "doctor: "))
		return 1
	}
	if !ok {
		return 1
	}
	return 0
}

// ParseFlags parses the doctor flags, and those each of extra registers.
// Usage and errors go to stderr.
//
// Errors: flag.ErrHelp for -h; the flag package's error for bad flags; an
// error naming the flag for a value out of range (a --max-* threshold of
// zero or below, but --max-claim-buffers 0, its default).
func ParseFlags(args []string, stderr io.Writer, extra ...func(*flag.FlagSet)) (asJSON bool, opts Options, err error) {
	var queue string
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	for _, register := range extra {
		register(fs)
	}
	fs.BoolVar(&asJSON, "json", false, "print the report as JSON")
	fs.StringVar(&queue, "queue", "", "check only this queue: inbox or outbox (default both)")
	fs.IntVar(&opts.BatchSize, "batch", 10, "batch size of the measured claim")
	fs.Int64Var(&opts.MaxClaimBuffers, "max-claim-buffers", 0, "most shared buffers the claim may touch (default 100 x batch)")
	fs.DurationVar(&opts.MaxOldestDue, "max-oldest-due", 15*time.Minute, "longest the oldest due message may have been due (time deferred, leased or waiting on a retry delay does not count)")
	fs.Int64Var(&opts.MaxDeadTuples, "max-dead-tuples", 100_000, "most dead row versions per queue table or ordering keys' table")
	fs.BoolVar(&opts.Plans, "plans", false, "print each claim plan's tree (the report shows its figures)")
	fs.DurationVar(&opts.MaxXactAge, "max-xact-age", 5*time.Minute, "longest a transaction may hold back VACUUM")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: leasectl doctor [--queue inbox|outbox] [--json] [flags]\n\n"+
			"Checks migrations, indexes, the claim's plan and cost, lease and backlog health,\n"+
			"dead rows and autovacuum, VACUUM and table rights, the work signal's sequence grant,\n"+
			"and sessions holding back VACUUM. Exit status 1 when something is wrong.\n\n")
		fs.PrintDefaults()
	}
	// usage reports a bad command line as leasectl's other commands do.
	usage := func(format string, args ...any) (bool, Options, error) {
		err := fmt.Errorf(format, args...)
		fmt.Fprintf(stderr, "leasectl doctor: %v\nRun 'leasectl doctor -h' for usage.\n", err)
		return false, Options{}, err
	}
	if err := fs.Parse(args); err != nil {
		return false, Options{}, err
	}
	if fs.NArg() > 0 {
		return usage("unexpected argument %q", fs.Arg(0))
	}
	if queue != "" {
		q, err := leasing.ParseQueue(queue)
		if err != nil {
			return usage("--queue must be inbox or outbox, got %q", queue)
		}
		opts.Queues = []leasing.Queue{q}
	}
	// Zero means "the default" in Options, but on the command line it is a
	// mistake, as is a negative threshold: the flags show their defaults.
	switch {
	case opts.BatchSize < 1 || opts.BatchSize > leasing.MaxBatchSize:
		return usage("--batch must be 1..%d, got %d", leasing.MaxBatchSize, opts.BatchSize)
	case opts.MaxClaimBuffers < 0:
		return usage("--max-claim-buffers must be >= 0 (0 for 100 x batch), got %d", opts.MaxClaimBuffers)
	case opts.MaxOldestDue <= 0:
		return usage("--max-oldest-due must be positive, got %s", opts.MaxOldestDue)
	case opts.MaxDeadTuples < 1:
		return usage("--max-dead-tuples must be at least 1, got %d", opts.MaxDeadTuples)
	case opts.MaxXactAge <= 0:
		return usage("--max-xact-age must be positive, got %s", opts.MaxXactAge)
	}
	return asJSON, opts, nil
}
