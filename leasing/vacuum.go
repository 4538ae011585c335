package leasing

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leasestore/leasestore/gen"
)

// Every claim and every outcome write leaves a dead row version, and a dead
// entry at the head of the claim indexes, which claims read past until
// VACUUM removes it. Autovacuum visits a database at most once per
// autovacuum_naptime (a server setting, 60 s by default): at thousands of
// messages a second the head grows by hundreds of thousands of dead entries
// between two visits and the claim's cost with it. A VacuumPolicy has the
// processors vacuum their own table as soon as enough rows died.

// Vacuum policy defaults.
const (
	// DefaultVacuumDeadRows is VacuumPolicy.DeadRows when left 0: the
	// autovacuum threshold migration 00001 sets on both tables.
	DefaultVacuumDeadRows = 5_000
	// DefaultVacuumCheckInterval is VacuumPolicy.CheckInterval when left 0.
	DefaultVacuumCheckInterval = 250 * time.Millisecond
	// DefaultVacuumDutyCycle is VacuumPolicy.DutyCycle when left 0.
	DefaultVacuumDutyCycle = 0.5
)

// ErrVacuumNotAllowed reports that the database user may not VACUUM the
// queue's table: only the table owner, the database owner and superusers
// may (PostgreSQL 15). Grant the owner role, or leave the table to
// autovacuum and turn the policy off.
var ErrVacuumNotAllowed = errors.New("leasing: not allowed to vacuum the queue table")

// VacuumPolicy decides when a processor vacuums its queue's table (see
// Postgres.KeepVacuumed). The zero value is on, with the defaults.
type VacuumPolicy struct {
	// Disabled turns the policy off: only autovacuum cleans the table.
	Disabled bool
	// DeadRows is the number of dead row versions in the table, as
	// PostgreSQL's statistics count them (n_dead_tup), at which VACUUM
	// runs, > 0. Defaults to DefaultVacuumDeadRows (5,000): about 2,500
	// messages claimed and finished. Backends report their counts about
	// once a second, so at high rates VACUUM runs about once a second.
	DeadRows int64
	// CheckInterval is the time between two reads of the dead-row count,
	// > 0. Defaults to DefaultVacuumCheckInterval (250 ms).
	CheckInterval time.Duration
	// DutyCycle bounds the share of wall time this policy spends in
	// VACUUM, in (0, 1]: after a VACUUM that took d, the next one starts
	// no sooner than d/DutyCycle after the first began. VACUUM reads every
	// page of every index of the table, so on a table of many millions of
	// rows it runs less often. Defaults to DefaultVacuumDutyCycle (0.5).
	DutyCycle float64
}

// resolve returns p with its defaults filled in, or an *ArgumentError.
func (p VacuumPolicy) resolve() (VacuumPolicy, error) {
	if p.DeadRows == 0 {
		p.DeadRows = DefaultVacuumDeadRows
	}
	if p.CheckInterval == 0 {
		p.CheckInterval = DefaultVacuumCheckInterval
	}
	if p.DutyCycle == 0 {
		p.DutyCycle = DefaultVacuumDutyCycle
	}
	if !(p.DutyCycle > 0 && p.DutyCycle <= 1) {
		return p, argumentError("vacuum duty cycle", "must be in (0, 1], got %g", p.DutyCycle)
	}
	if err := ValidatePositive("vacuum dead rows", p.DeadRows); err != nil {
		return p, err
	}
	if err := ValidatePositive("vacuum check interval", p.CheckInterval); err != nil {
		return p, err
	}
	return p, nil
}

// Vacuum reports one VacuumIfDead call.
type Vacuum struct {
	// DeadRows is the dead row versions the statistics counted before.
	DeadRows int64
	// Ran is true when VACUUM was sent. It is not sent while another
	// VACUUM of the table runs; one that starts in between makes it
	// return at once, having done nothing (SKIP_LOCKED).
	Ran bool
	// Duration is how long VACUUM took; 0 when it did not run.
	Duration time.Duration
}

// VacuumIfDead runs VACUUM (INDEX_CLEANUP ON, SKIP_LOCKED) on the queue's
// table (db/queries/maintenance.sql) when PostgreSQL's statistics count at
// least deadRows (> 0) dead row versions in it and no VACUUM of it is
// running. VACUUM holds one pool connection, outside any transaction, for
// as long as it runs: size the pool with one connection to spare for it.
// Concurrent callers are safe (one vacuums, the others skip).
//
// Errors: an *ArgumentError for deadRows <= 0; ErrVacuumNotAllowed when
// the user may not VACUUM the table (nothing is sent); otherwise the
// driver's.
func (s *Postgres) VacuumIfDead(ctx context.Context, deadRows int64) (Vacuum, error) {
	if err := ValidatePositive("vacuum dead rows", deadRows); err != nil {
		return Vacuum{}, err
	}
	g := gen.New()
	st, err := g.VacuumState(ctx, s.pool, gen.VacuumStateParams{TableName: s.queue.Table()})
	if err != nil {
		return Vacuum{}, fmt.Errorf("leasing: vacuum %s: %w", s.queue, err)
	}
	v := Vacuum{DeadRows: st.DeadRows}
	if !st.MayVacuum {
		return v, fmt.Errorf("%w %s", ErrVacuumNotAllowed, s.queue.Table())
	}
	if st.DeadRows < deadRows || st.Running {
		return v, nil
	}
	vacuum := g.InboxVacuum
	if s.queue == Outbox {
		vacuum = g.OutboxVacuum
	}
	start := time.Now()
	if err := vacuum(ctx, s.pool); err != nil {
		return v, fmt.Errorf("leasing: vacuum %s: %w", s.queue, err)
	}
	v.Ran, v.Duration = true, time.Since(start)
	return v, nil
}

// KeepVacuumed calls VacuumIfDead every policy.CheckInterval until ctx
// ends, and returns then. Errors go to onError (when not nil) and the loop
// goes on, except ErrVacuumNotAllowed, which it reports once and returns.
// A disabled policy returns at once. Processors on a Postgres store run it
// with ProcessorOptions.Vacuum.
//
// Errors: an *ArgumentError for a bad policy, before anything runs.
func (s *Postgres) KeepVacuumed(ctx context.Context, policy VacuumPolicy, onError func(error)) error {
	policy, err := policy.resolve()
	if err != nil || policy.Disabled {
		return err
	}
	wait := policy.CheckInterval
	for {
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		}
		v, err := s.VacuumIfDead(ctx, policy.DeadRows)
		if err != nil && ctx.Err() == nil && onError != nil {
			onError(err)
		}
		if errors.Is(err, ErrVacuumNotAllowed) {
			return nil
		}
		// A VACUUM that took d is followed by d/DutyCycle - d of rest.
		wait = max(policy.CheckInterval, time.Duration(float64(v.Duration)/policy.DutyCycle)-v.Duration)
	}
}
