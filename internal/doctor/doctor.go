// Package doctor checks the health of the leasestore queues on a database:
// the migrations this version needs and the indexes a claim needs (the
// list leasing.CheckSchema checks, from db.Requirements), the plan and cost of a real claim (run under
// EXPLAIN ANALYZE and rolled back), the pauses in place, lease and backlog health, dead rows and
// autovacuum of the queue tables and their ordering keys' tables, the
// connected role's rights to VACUUM them and to read the work signal's
// sequence, sessions that hold back VACUUM, and an inbox on asynchronous
// replication. Each problem comes with its
// reason in words; warnings are reported but leave the database healthy.
package doctor

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/leasing"
)

// Options tunes the checks. Zero fields take their defaults.
type Options struct {
	// Queues are the queues to check. Defaults to inbox and outbox.
	Queues []leasing.Queue
	// BatchSize is the batch size of the claim whose plan is measured.
	// Defaults to 10.
	BatchSize int
	// MaxClaimBuffers is the most shared buffers (8 KiB pages) that claim
	// may touch before it is a problem. A healthy claim of 10 touches about
	// 120, whatever the backlog. Defaults to 100 × BatchSize.
	MaxClaimBuffers int64
	// MaxOldestDue is the longest a message may have been due (since its
	// visibility time, or since its lease expired) before it is a problem.
	// Defaults to 15 minutes.
	MaxOldestDue time.Duration
	// MaxDeadTuples is the most dead row versions a queue table, or its
	// ordering keys' table, may hold before it is a problem (the shipped
	// settings start autovacuum of the queue tables at 5,000). Defaults to
	// 100,000.
	MaxDeadTuples int64
	// MaxXactAge is the longest a transaction may hold back VACUUM before
	// it is a problem. Defaults to 5 minutes.
	MaxXactAge time.Duration
	// Plans prints each claim plan's tree in the text report (leasectl
	// doctor --plans); without it the report shows the plan's figures.
	Plans bool
}

func (o Options) withDefaults() Options {
	if len(o.Queues) == 0 {
		o.Queues = []leasing.Queue{leasing.Inbox, leasing.Outbox}
	}
	if o.BatchSize == 0 {
		o.BatchSize = 10
	}
	if o.MaxClaimBuffers == 0 {
		o.MaxClaimBuffers = 100 * int64(o.BatchSize)
	}
	if o.MaxOldestDue == 0 {
		o.MaxOldestDue = 15 * time.Minute
	}
	if o.MaxDeadTuples == 0 {
		o.MaxDeadTuples = 100_000
	}
	if o.MaxXactAge == 0 {
		o.MaxXactAge = 5 * time.Minute
	}
	return o
}

// Check runs every check on pool's database and returns the report. The
// claim it measures really runs inside a transaction that is rolled back
// (see explain.Claim): it briefly locks up to BatchSize due
// rows and leaves as many dead row versions. The processors' privileges
// are checked as processors check them (leasing.Postgres.CheckPrivileges:
// their statements for no message, rolled back).
//
// Errors: the first query that failed to run (a failed check is a problem
// in the report, not an error).
func Check(ctx context.Context, pool *pgxpool.Pool, opts Options) (Report, error) {
	opts = opts.withDefaults()
	rep := Report{Queues: []QueueReport{}, Migrations: []MigrationState{}, Problems: []string{}, Warnings: []string{}}
	if opts.BatchSize < 1 || opts.BatchSize > leasing.MaxBatchSize {
		return rep, fmt.Errorf("doctor: batch size must be 1..%d, got %d", leasing.MaxBatchSize, opts.BatchSize)
	}
	if err := checkMigrations(ctx, pool, opts, &rep); err != nil {
		return rep, err
	}
	behind := slices.ContainsFunc(rep.Migrations, func(m MigrationState) bool { return !m.Applied })
	for _, q := range opts.Queues {
		qr, err := checkQueue(ctx, pool, q, opts, behind)
		if err != nil {
			return rep, err
		}
		rep.Queues = append(rep.Queues, qr)
	}
	if err := checkServer(ctx, pool, opts, &rep); err != nil {
		return rep, err
	}
	if err := checkReplication(ctx, pool, opts, &rep); err != nil {
		return rep, err
	}
	rep.OK = len(rep.Problems) == 0
	for _, qr := range rep.Queues {
		rep.OK = rep.OK && len(qr.Problems) == 0
	}
	return rep, nil
}

// Run runs Check and writes the report to out, as JSON when asJSON, else as
// text. ok is Report.OK.
//
// Errors: those of Check, and write errors.
func Run(ctx context.Context, pool *pgxpool.Pool, out io.Writer, asJSON bool, opts Options) (ok bool, err error) {
	rep, err := Check(ctx, pool, opts)
	if err != nil {
		return false, err
	}
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return rep.OK, enc.Encode(rep)
	}
	rep.ShowPlans = opts.Plans
	return rep.OK, WriteText(out, rep)
}

// notes collects a check's findings in words (formats in messages.go)
// into a report's Problems and Warnings.
type notes struct{ problems, warnings *[]string }

func (n notes) problem(format string, args ...any) {
	*n.problems = append(*n.problems, fmt.Sprintf(format, args...))
}

func (n notes) warn(format string, args ...any) {
	*n.warnings = append(*n.warnings, fmt.Sprintf(format, args...))
}
