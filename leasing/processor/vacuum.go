package processor

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/leasestore/leasestore/internal/wait"
	"github.com/leasestore/leasestore/leasing"
)

// Every claim and outcome write leaves dead row versions that claims read
// past until VACUUM removes them, and autovacuum may visit only once a
// minute: a VacuumPolicy has the processors vacuum their queue's tables as
// soon as enough rows died (docs/operations.md, Vacuum).

// Vacuum policy defaults.
const (
	DefaultVacuumDeadRows      = 5_000 // the autovacuum threshold migration 00001 sets
	DefaultVacuumCheckInterval = 250 * time.Millisecond
	DefaultVacuumDutyCycle     = 0.5
)

// Vacuumer is a store that can vacuum its queue's table and its ordering
// keys' table (*leasing.Postgres); a Processor on one runs KeepVacuumed.
type Vacuumer interface {
	// VacuumIfDead vacuums each table that has at least deadRows dead row
	// versions; see leasing.Postgres.VacuumIfDead.
	VacuumIfDead(ctx context.Context, deadRows int64) (leasing.Vacuum, error)
}

var _ Vacuumer = (*leasing.Postgres)(nil)

// VacuumPolicy decides when a processor vacuums its queue's tables. The
// zero value is on, with the defaults.
type VacuumPolicy struct {
	// Disabled turns the policy off: only autovacuum cleans the tables.
	Disabled bool
	// DeadRows is the dead row versions in a table (n_dead_tup) at which
	// it is vacuumed, > 0. Defaults to DefaultVacuumDeadRows.
	DeadRows int64
	// CheckInterval is the time between two reads of the dead-row count,
	// > 0; a processor reads it only while it wrote rows in the last
	// vacuumStatsLag (11 s). Defaults to DefaultVacuumCheckInterval.
	CheckInterval time.Duration
	// DutyCycle bounds the share of wall time spent in VACUUM, in (0, 1]:
	// VACUUMs that took d are followed by d/DutyCycle - d of rest.
	// Defaults to DefaultVacuumDutyCycle.
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
// ctx ends, then returns nil. Errors go to onError (when not nil) and the
// loop goes on, but leasing.ErrVacuumNotAllowed, reported once, ends it. A
// disabled policy returns at once.
//
// Errors: a *leasing.ArgumentError for a nil store or a bad policy.
func KeepVacuumed(ctx context.Context, store Vacuumer, policy VacuumPolicy, onError func(error)) error {
	return keepVacuumed(ctx, store, policy, onError, nil)
}

// vacuumStatsLag is how long a processor's vacuum policy goes on checking
// after its last write: the statistics of a backend that went idle arrive
// up to 10 seconds later (PostgreSQL 15's PGSTAT_IDLE_INTERVAL).
const vacuumStatsLag = 11 * time.Second

// keepVacuumed is KeepVacuumed; with wrote (sent to after each write), a
// check waits for a write unless the last came within vacuumStatsLag.
func keepVacuumed(ctx context.Context, store Vacuumer, policy VacuumPolicy, onError func(error), wrote <-chan struct{}) error {
	if store == nil {
		return argumentError("store", "must not be nil")
	}
	policy, err := policy.resolve()
	if err != nil || policy.Disabled {
		return err
	}
	interval := policy.CheckInterval
	var lastWrite time.Time // none yet: wait for the first
	for {
		if !wait.Sleep(ctx, interval) {
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
		d := v.Duration + v.Keys.Duration
		interval = max(policy.CheckInterval, time.Duration(float64(d)/policy.DutyCycle)-d)
	}
}

// loggedVacuumer is a Vacuumer that logs each run (debug, one record per
// table vacuumed) and each error (warn) of the Vacuumer it wraps.
type loggedVacuumer struct {
	Vacuumer
	queue leasing.Queue
	log   logger
}

// vacuumer returns v, wrapped to log when p logs.
func (p *Processor) vacuumer(v Vacuumer) Vacuumer {
	if p.ev.log.l == nil {
		return v
	}
	return loggedVacuumer{Vacuumer: v, queue: p.store.Queue(), log: p.ev.log}
}

// vacuumNotAllowedAdvice is the processor's one log record when its role
// may not vacuum, with what to do; internal/doctor gives the same advice.
const vacuumNotAllowedAdvice = "this role may not VACUUM the queue's tables, which are left to autovacuum: " +
	"fine at moderate churn; to have processors vacuum, rerun db/roles.sql on PostgreSQL 17+ (it grants MAINTAIN) " +
	"or run them as the tables' owner; VacuumPolicy.Disabled silences this"

func (v loggedVacuumer) VacuumIfDead(ctx context.Context, deadRows int64) (leasing.Vacuum, error) {
	res, err := v.Vacuumer.VacuumIfDead(ctx, deadRows)
	switch {
	case errors.Is(err, leasing.ErrVacuumNotAllowed):
		v.log.log(slog.LevelInfo, vacuumNotAllowedAdvice, errAttr(err))
	case err != nil && ctx.Err() == nil:
		v.log.log(slog.LevelWarn, "vacuum failed", errAttr(err))
	}
	if res.Ran {
		v.vacuumRan(v.queue.Table(), res.DeadRows, res.Duration)
	}
	if res.Keys.Ran {
		v.vacuumRan(v.queue.KeyTable(), res.Keys.DeadRows, res.Keys.Duration)
	}
	return res, err
}

// vacuumRan logs one VACUUM of table (debug).
func (v loggedVacuumer) vacuumRan(table string, deadRows int64, d time.Duration) {
	v.log.log(slog.LevelDebug, "vacuum ran", slog.String("table", table), slog.Int64("dead_rows", deadRows), slog.Duration("duration", d))
}
