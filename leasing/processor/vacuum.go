package processor

import (
	"context"
	"errors"
	"time"

	"github.com/leasestore/leasestore/leasing"
)

// Every claim and every outcome write leaves a dead row version, and a dead
// entry at the head of the claim indexes, which claims read past until
// VACUUM removes it. Autovacuum visits a database at most once per
// autovacuum_naptime (a server setting, 60 s by default): at thousands of
// messages a second the head grows by hundreds of thousands of dead entries
// between two visits and the claim's cost with it. A VacuumPolicy has the
// processors vacuum their own table as soon as enough rows died, and the
// queue's ordering keys' table too: every finished keyed message leaves a
// dead version of its key row.

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

// Vacuumer is a store that can vacuum its queue's table and its ordering
// keys' table: *leasing.Postgres.
// A Processor whose Store is also a Vacuumer runs KeepVacuumed with its
// Vacuum policy.
type Vacuumer interface {
	// VacuumIfDead runs VACUUM on the queue's table and on its ordering
	// keys' table, each when the statistics count at least deadRows dead
	// row versions in it and no VACUUM of it runs; see
	// leasing.Postgres.VacuumIfDead.
	VacuumIfDead(ctx context.Context, deadRows int64) (leasing.Vacuum, error)
}

var _ Vacuumer = (*leasing.Postgres)(nil)

// VacuumPolicy decides when a processor vacuums its queue's table and its
// ordering keys' table (see KeepVacuumed). The zero value is on, with the
// defaults.
type VacuumPolicy struct {
	// Disabled turns the policy off: only autovacuum cleans the tables.
	Disabled bool
	// DeadRows is the number of dead row versions in a table, as
	// PostgreSQL's statistics count them (n_dead_tup), at which VACUUM
	// runs, > 0; each of the two tables is counted on its own. Defaults
	// to DefaultVacuumDeadRows (5,000): about 2,500 messages claimed and
	// finished. Backends report their counts about once a second, so at
	// high rates VACUUM runs about once a second.
	DeadRows int64
	// CheckInterval is the time between two reads of the dead-row count,
	// > 0; a Processor reads it only while it wrote rows (claims, renews,
	// outcomes) in the last 11 seconds (the statistics may report dead
	// rows up to about 10 seconds late), so an idle one reads nothing. Defaults to
	// DefaultVacuumCheckInterval (250 ms).
	CheckInterval time.Duration
	// DutyCycle bounds the share of wall time this policy spends in
	// VACUUM, in (0, 1]: after a check whose VACUUMs took d together
	// (leasing.Vacuum's Duration plus Keys.Duration), the next check comes
	// no sooner than d/DutyCycle after they began. VACUUM reads every
	// page of every index of the table, so on a table of many millions of
	// rows it runs less often. Defaults to DefaultVacuumDutyCycle (0.5).
	DutyCycle float64
}

// resolve returns p with its defaults filled in, or a
// *leasing.ArgumentError.
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
	if err := leasing.ValidatePositive("vacuum dead rows", p.DeadRows); err != nil {
		return p, err
	}
	if err := leasing.ValidatePositive("vacuum check interval", p.CheckInterval); err != nil {
		return p, err
	}
	return p, nil
}

// KeepVacuumed calls store.VacuumIfDead every policy.CheckInterval until
// ctx ends, and returns nil then. Errors go to onError (when not nil) and
// the loop goes on, except leasing.ErrVacuumNotAllowed, which it reports
// once and returns nil. A disabled policy returns at once. Processors on a
// Vacuumer store run the same loop with Options.Vacuum, but check only
// while they wrote rows in the last vacuumStatsLag (at most once per
// CheckInterval), so that an idle processor sends nothing.
//
// Errors: a *leasing.ArgumentError for a nil store or a bad policy, before
// anything runs.
func KeepVacuumed(ctx context.Context, store Vacuumer, policy VacuumPolicy, onError func(error)) error {
	return keepVacuumed(ctx, store, policy, onError, nil)
}

// vacuumStatsLag is how long a processor's vacuum policy goes on checking
// after its last write: a backend sends its statistics at most once a
// second, and what its last transactions left before it went idle waits
// for its idle flush, 10 seconds later (PostgreSQL 15's
// PGSTAT_IDLE_INTERVAL), so the dead rows of a processor's last writes
// reach n_dead_tup up to about 10 seconds after them.
const vacuumStatsLag = 11 * time.Second

// keepVacuumed is KeepVacuumed; when wrote is not nil (sent to after the
// caller wrote rows), a check waits for a write unless the last one came
// less than vacuumStatsLag ago.
func keepVacuumed(ctx context.Context, store Vacuumer, policy VacuumPolicy, onError func(error), wrote <-chan struct{}) error {
	if store == nil {
		return argumentError("store", "must not be nil")
	}
	policy, err := policy.resolve()
	if err != nil || policy.Disabled {
		return err
	}
	wait := policy.CheckInterval
	var lastWrite time.Time // none yet: wait for the first
	for {
		if !pause(ctx, wait) {
			return nil
		}
		if wrote != nil {
			select {
			case <-wrote:
				lastWrite = time.Now()
			default:
			}
			if time.Since(lastWrite) > vacuumStatsLag {
				select {
				case <-ctx.Done():
					return nil
				case <-wrote:
					lastWrite = time.Now()
				}
			}
		}
		v, err := store.VacuumIfDead(ctx, policy.DeadRows)
		if err != nil && ctx.Err() == nil && onError != nil {
			onError(err)
		}
		if errors.Is(err, leasing.ErrVacuumNotAllowed) {
			return nil
		}
		// VACUUMs that took d are followed by d/DutyCycle - d of rest.
		d := v.Duration + v.Keys.Duration
		wait = max(policy.CheckInterval, time.Duration(float64(d)/policy.DutyCycle)-d)
	}
}
