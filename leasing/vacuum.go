package leasing

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leasestore/leasestore/gen"
)

// ErrVacuumNotAllowed reports that the database user may not VACUUM the
// queue's table: only the table owner, the database owner and superusers
// may (PostgreSQL 15). Grant the owner role, or leave the table to
// autovacuum and turn the processor's vacuum policy off
// (processor.VacuumPolicy.Disabled).
var ErrVacuumNotAllowed = errors.New("leasing: not allowed to vacuum the queue table")

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
// running. The check runs at READ COMMITTED like every other statement of
// the store; VACUUM cannot run in a transaction, and SKIP_LOCKED makes it
// skip a table it cannot lock at once, so the lock timeout does not
// concern it. VACUUM holds one pool connection, outside any transaction, for
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
	var st gen.VacuumStateRow
	err := s.pipelineAnySchema(ctx, func(db gen.DBTX) (err error) {
		st, err = gen.New().VacuumState(ctx, db, gen.VacuumStateParams{TableName: s.queue.Table()})
		return err
	})
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
	start := time.Now()
	if err := s.sql.vacuum(ctx, s.pool); err != nil {
		return v, fmt.Errorf("leasing: vacuum %s: %w", s.queue, err)
	}
	v.Ran, v.Duration = true, time.Since(start)
	return v, nil
}
