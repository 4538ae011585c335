package doctor

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/leasing"
)

// checkQueue runs the checks of one queue, in report order: its tables'
// vacuum rights, the work signal, the indexes, the processors' privileges,
// then (when they allow it) the pauses, the backlog and the claim, and last the
// tables' dead rows and storage options. A queue whose table is missing
// gets that one problem.
func checkQueue(ctx context.Context, pool *pgxpool.Pool, q leasing.Queue, opts Options, schemaBehind bool) (QueueReport, error) {
	t := q.Table()
	qr := QueueReport{
		Queue: string(q), Table: t, Indexes: []IndexState{}, ClaimPlan: []string{}, ClaimIndexes: []string{},
		Paused: []PauseState{}, Depth: map[string]int64{}, TableState: TableState{StorageOptions: []string{}}, Problems: []string{}, Warnings: []string{},
	}
	n := notes{&qr.Problems, &qr.Warnings}

	table, found, err := readTable(ctx, pool, t)
	if err != nil {
		return qr, err
	}
	if !found {
		n.problem(msgTableMissing, t)
		return qr, nil
	}
	qr.TableState = table
	switch keys, found, err := readTable(ctx, pool, q.KeyTable()); {
	case err != nil:
		return qr, err
	case found: // none before migration 00010, which checkMigrations reports
		qr.Keys = &KeyTableState{Table: q.KeyTable(), TableState: keys}
	}
	checkVacuumRights(&qr, n)
	if err := checkSignal(ctx, pool, &qr, n); err != nil {
		return qr, err
	}
	if err := checkIndexes(ctx, pool, q, &qr, n); err != nil {
		return qr, err
	}

	store, err := leasing.NewPostgres(pool, q, leasing.PostgresOptions{SkipSchemaCheck: true}) // checkMigrations and the index checks report the schema
	if err != nil {
		return qr, err
	}
	allowed, err := checkPrivileges(ctx, store, schemaBehind, n)
	if err != nil {
		return qr, fmt.Errorf("doctor: %s privileges: %w", t, err)
	}
	if allowed {
		if err := checkPauses(ctx, store, schemaBehind, &qr, n); err != nil {
			return qr, err
		}
		err := checkBacklog(ctx, store, q, opts, schemaBehind, &qr, n)
		switch {
		case errors.Is(err, leasing.ErrPermissionDenied): // privileges not checked: the schema is behind
			n.problem(msgQueueUnreadable, err)
		case err != nil:
			return qr, err
		}
	}

	checkTables(&qr, opts, n)
	return qr, nil
}
