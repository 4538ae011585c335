package doctor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/gen"
)

// shippedOptions are the storage options db/migrations sets on both tables;
// doctor warns when one is missing.
var shippedOptions = []string{
	"fillfactor=80",
	"autovacuum_vacuum_scale_factor=0.0",
	"autovacuum_vacuum_threshold=5000",
}

// readTable returns table's statistics, vacuum right and storage options;
// found is false when the table does not exist.
func readTable(ctx context.Context, pool *pgxpool.Pool, table string) (st TableState, found bool, err error) {
	g := gen.New()
	health, err := g.DiagnosticsTableHealth(ctx, pool, gen.DiagnosticsTableHealthParams{TableName: table})
	if errors.Is(err, pgx.ErrNoRows) {
		return TableState{}, false, nil
	}
	if err != nil {
		return TableState{}, false, fmt.Errorf("doctor: %s statistics: %w", table, err)
	}
	vacuum, err := g.VacuumState(ctx, pool, gen.VacuumStateParams{TableName: table})
	if err != nil {
		return TableState{}, false, fmt.Errorf("doctor: %s vacuum rights: %w", table, err)
	}
	return TableState{
		DeadTuples: health.DeadTuples, LiveTuples: health.LiveTuples,
		LastAutovacuum: utc(health.LastAutovacuum), LastVacuum: utc(health.LastVacuum),
		MayVacuum: vacuum.MayVacuum, StorageOptions: append([]string{}, health.Reloptions...),
	}, true, nil
}

// checkVacuumRights warns when the role may not VACUUM the queue table or
// its ordering keys' table: processors' vacuum policy needs both.
func checkVacuumRights(qr *QueueReport, n notes) {
	switch {
	case qr.Keys == nil:
		if !qr.MayVacuum {
			n.warn(msgVacuumRefused, qr.Table)
		}
	case !qr.MayVacuum || !qr.Keys.MayVacuum:
		var denied []string
		if !qr.MayVacuum {
			denied = append(denied, qr.Table)
		}
		if !qr.Keys.MayVacuum {
			denied = append(denied, qr.Keys.Table)
		}
		n.warn(msgVacuumRefusedKeys, strings.Join(denied, " and "), qr.Table, qr.Keys.Table)
	}
}

// checkTables reports dead rows past opts.MaxDeadTuples and autovacuum
// turned off on the queue's tables, and warns of each shipped storage
// option missing from the queue table.
func checkTables(qr *QueueReport, opts Options, n notes) {
	if qr.DeadTuples > opts.MaxDeadTuples {
		n.problem(msgDeadTuples, qr.DeadTuples, opts.MaxDeadTuples, ago(qr.LastAutovacuum))
	}
	if k := qr.Keys; k != nil && k.autovacuumOff() {
		n.problem(msgKeysAutovacuumOff, k.Table)
	}
	if k := qr.Keys; k != nil && k.DeadTuples > opts.MaxDeadTuples {
		n.problem(msgKeysDeadTuples, k.Table, k.DeadTuples, opts.MaxDeadTuples, ago(k.LastAutovacuum))
	}
	if qr.autovacuumOff() {
		n.problem(msgAutovacuumOff, qr.Table)
	}
	for _, want := range shippedOptions {
		if !slices.Contains(qr.StorageOptions, want) {
			n.warn(msgStorageOption, want, qr.Table)
		}
	}
}
