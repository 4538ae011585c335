package leasing

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasestore/leasestore/gen"
)

// ErrVacuumNotAllowed reports that the database user may not VACUUM the
// queue's table or its ordering keys' table (Queue.KeyTable): only the
// table owner, the database owner and superusers may (PostgreSQL 15). The
// error names the tables. Grant the owner role of both (the migrations
// create them with one owner), or leave the tables to autovacuum and turn
// the processor's vacuum policy off (processor.VacuumPolicy.Disabled).
var ErrVacuumNotAllowed = errors.New("leasing: not allowed to vacuum")

// Vacuum reports one VacuumIfDead call: DeadRows, Ran and Duration the
// queue's table, Keys its ordering keys' table.
type Vacuum struct {
	// DeadRows is the dead row versions the statistics counted before.
	DeadRows int64
	// Ran is true when VACUUM was sent. It is not sent while another
	// VACUUM of the table runs; one that starts in between makes it
	// return at once, having done nothing (SKIP_LOCKED).
	Ran bool
	// Duration is how long VACUUM took; 0 when it did not run.
	Duration time.Duration
	// Keys reports the queue's ordering keys' table (Queue.KeyTable); it
	// is the zero value on a schema before migration 00010, which has no
	// such table.
	Keys KeysVacuum
}

// KeysVacuum reports what one VacuumIfDead call did to the queue's
// ordering keys' table.
type KeysVacuum struct {
	// DeadRows is the dead row versions the statistics counted before.
	DeadRows int64
	// Ran is true when VACUUM (ANALYZE) was sent: at the same dead-row
	// threshold as the queue's table, or when the statistics count live
	// rows in a table that was never analysed. Not while another VACUUM of
	// the table runs (SKIP_LOCKED, as for the queue's table).
	Ran bool
	// Duration is how long VACUUM (ANALYZE) took; 0 when it did not run.
	Duration time.Duration
}

// VacuumIfDead vacuums the queue's table, then (with ANALYZE) its ordering
// keys' table (db/queries/vacuum.sql.tmpl), each when PostgreSQL's
// statistics count at least deadRows (> 0) dead row versions in it and no
// VACUUM of it runs; the keys' table also once when it holds rows and was
// never analysed, so that the planner has its statistics. A schema before
// migration 00010 has no keys' table. VACUUM runs outside any transaction
// on one pool connection (size the pool with one to spare) and skips a
// table it cannot lock at once; concurrent callers are safe.
//
// Errors: an *ArgumentError for deadRows <= 0; ErrVacuumNotAllowed when
// the user may not VACUUM one of the tables (nothing is sent); otherwise
// the driver's (a failed VACUUM of the queue's table leaves the keys'
// table for the next call).
func (s *Postgres) VacuumIfDead(ctx context.Context, deadRows int64) (Vacuum, error) {
	if err := ValidatePositive("vacuum dead rows", deadRows); err != nil {
		return Vacuum{}, err
	}
	g := gen.New()
	table := bind(g.VacuumState, gen.VacuumStateParams{TableName: s.queue.Table()})
	keys := &optional[gen.VacuumStateParams, *gen.VacuumStateRow]{stmt: bind(g.VacuumState, gen.VacuumStateParams{TableName: s.queue.KeyTable()})}
	if err := s.send(ctx, anySchema, table, keys); err != nil {
		return Vacuum{}, fmt.Errorf("leasing: vacuum %s: %w", s.queue, err)
	}
	return s.vacuum(ctx, deadRows, table.out, keys.out, keys.found)
}

// vacuum is VacuumIfDead once the tables' states are read; hasKeys is
// false on a schema before migration 00010.
func (s *Postgres) vacuum(ctx context.Context, deadRows int64, table, keys *gen.VacuumStateRow, hasKeys bool) (Vacuum, error) {
	v := Vacuum{DeadRows: table.DeadRows}
	var denied []string
	if !table.MayVacuum {
		denied = append(denied, s.queue.Table())
	}
	if hasKeys {
		v.Keys.DeadRows = keys.DeadRows
		if !keys.MayVacuum {
			denied = append(denied, s.queue.KeyTable())
		}
	}
	if len(denied) > 0 {
		return v, fmt.Errorf("%w %s", ErrVacuumNotAllowed, strings.Join(denied, " and "))
	}
	if vacuumDue(table, deadRows, false) {
		start := time.Now()
		if err := runIn(ctx, s.pool, bind(s.q.vacuum, struct{}{})); err != nil {
			return v, fmt.Errorf("leasing: vacuum %s: %w", s.queue.Table(), err)
		}
		v.Ran, v.Duration = true, time.Since(start)
	}
	if hasKeys && vacuumDue(keys, deadRows, true) {
		start := time.Now()
		if err := runIn(ctx, s.pool, bind(s.q.vacuumKeys, struct{}{})); err != nil {
			return v, fmt.Errorf("leasing: vacuum %s: %w", s.queue.KeyTable(), err)
		}
		v.Keys.Ran, v.Keys.Duration = true, time.Since(start)
	}
	return v, nil
}

// vacuumDue reports whether VacuumIfDead sends VACUUM for a table in state
// st: none runs, and the statistics count at least deadRows dead row
// versions or, when analyse, live rows in a table never analysed.
func vacuumDue(st *gen.VacuumStateRow, deadRows int64, analyse bool) bool {
	if st.Running {
		return false
	}
	return st.DeadRows >= deadRows || analyse && !st.Analyzed && st.LiveRows > 0
}

// optional is a step whose statement may return no row: found says
// whether it did, and no row is no error.
type optional[P, R any] struct {
	stmt  *stmt[P, R]
	out   R
	found bool
}

func (o *optional[P, R]) run(ctx context.Context, db gen.DBTX) error {
	err := o.stmt.run(ctx, db)
	o.out, o.found = o.stmt.out, !errors.Is(err, pgx.ErrNoRows)
	if !o.found {
		return nil
	}
	return err
}
