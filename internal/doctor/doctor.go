// Package doctor checks the health of the leasestore queues on a database:
// the migrations this version needs and the indexes a claim needs (the
// list leasing.CheckSchema checks, from db.Requirements), the plan and cost of a real claim (run under
// EXPLAIN ANALYZE and rolled back), lease and backlog health, dead rows and
// autovacuum of the queue tables and their ordering keys' tables, the
// connected role's rights to VACUUM them and to read the work signal's
// sequence, and sessions that hold back VACUUM. Each problem comes with its
// reason in words; warnings are reported but leave the database healthy.
package doctor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/db"
	"github.com/leasestore/leasestore/gen"
	"github.com/leasestore/leasestore/internal/explain"
	"github.com/leasestore/leasestore/internal/plural"
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

// Report is the outcome of Check. Times are UTC; ages are in seconds.
type Report struct {
	// OK is true when no queue and no server check found a problem.
	OK bool `json:"ok"`
	// Queues holds one entry per checked queue, in Options order.
	Queues []QueueReport `json:"queues"`
	// OldestXactSeconds is the age of the oldest transaction (or session
	// snapshot) in this database that holds back VACUUM; 0 when none.
	OldestXactSeconds float64 `json:"oldest_xact_seconds"`
	// OldestXactPID, OldestXactState and OldestXactApplication identify it.
	OldestXactPID         int32  `json:"oldest_xact_pid,omitempty"`
	OldestXactState       string `json:"oldest_xact_state,omitempty"`
	OldestXactApplication string `json:"oldest_xact_application,omitempty"`
	// PreparedXacts counts prepared transactions in this database;
	// OldestPreparedSeconds is the age of the oldest.
	PreparedXacts         int64   `json:"prepared_xacts"`
	OldestPreparedSeconds float64 `json:"oldest_prepared_seconds"`
	// Autovacuum is the server's autovacuum setting; AutovacuumNaptimeSeconds
	// is how often autovacuum visits each database.
	Autovacuum               bool    `json:"autovacuum"`
	AutovacuumNaptimeSeconds float64 `json:"autovacuum_naptime_seconds"`
	// Migrations lists every migration this version needs
	// (db.Requirements) and whether the history (db.VersionTable) records
	// it applied; empty when the role may not read the history (a
	// warning). MigrationHistory is false when that table is missing.
	Migrations       []MigrationState `json:"migrations"`
	MigrationHistory bool             `json:"migration_history"`
	// Problems and Warnings are the server-wide findings, in words.
	Problems []string `json:"problems"`
	Warnings []string `json:"warnings"`
}

// MigrationState is one required migration.
type MigrationState struct {
	// Name is the migration file's name without .sql, e.g.
	// "00005_lease_expiry_idx".
	Name    string `json:"name"`
	Applied bool   `json:"applied"`
}

// OldestHead is the ordering key whose head has held it longest while
// messages wait behind it.
type OldestHead struct {
	TenantID    string  `json:"tenant_id,omitempty"`
	OrderingKey string  `json:"ordering_key"`
	MessageID   string  `json:"message_id"`
	AgeSeconds  float64 `json:"age_seconds"`
}

// QueueReport is what Check found for one queue.
type QueueReport struct {
	Queue string `json:"queue"`
	Table string `json:"table"`
	// Indexes lists the required indexes and their state.
	Indexes []IndexState `json:"indexes"`
	// ClaimPlan is the plan shape of a claim of ClaimBatch rows, one node
	// per line (see explain.ClaimPlan.Nodes); ClaimIndexes the indexes it
	// scans.
	ClaimPlan    []string `json:"claim_plan"`
	ClaimIndexes []string `json:"claim_indexes"`
	ClaimBatch   int      `json:"claim_batch"`
	// ClaimRows is how many rows the claim took (then gave back).
	ClaimRows int `json:"claim_rows"`
	// ClaimBuffers is the shared buffers (8 KiB pages) the claim touched.
	ClaimBuffers int64 `json:"claim_buffers"`
	// ClaimMs is the claim's execution time in milliseconds.
	ClaimMs float64 `json:"claim_ms"`
	// SeqScan, SortOverEligible, TempBlocks and JIT are the plan warnings
	// of explain.ClaimPlan.
	SeqScan          bool  `json:"seq_scan"`
	SortOverEligible bool  `json:"sort_over_eligible"`
	TempBlocks       int64 `json:"temp_blocks"`
	JIT              bool  `json:"jit"`
	// GenericClaimBuffers, GenericSeqScan and GenericSortOverEligible are the
	// same for the claim's generic plan, which leasing.Postgres runs every
	// claim on (see explain.ClaimGeneric).
	GenericClaimBuffers     int64 `json:"generic_claim_buffers"`
	GenericSeqScan          bool  `json:"generic_seq_scan"`
	GenericSortOverEligible bool  `json:"generic_sort_over_eligible"`
	// ExpiredLeases counts in-flight rows whose lease expired and that no
	// claim has taken over yet.
	ExpiredLeases int64 `json:"expired_leases"`
	// OldestDueSeconds is how long the oldest due message has existed; 0
	// when nothing is due.
	OldestDueSeconds float64 `json:"oldest_due_seconds"`
	// Overdue is true when some message has been due for longer than
	// Options.MaxOldestDue (time deferred, leased or waiting on a retry
	// delay does not count).
	Overdue bool `json:"overdue"`
	// DeadLettered counts dead-lettered rows waiting for an operator.
	DeadLettered int64 `json:"dead_lettered"`
	// Waiting counts keyed messages waiting behind their key's head.
	Waiting int64 `json:"waiting"`
	// OldestHead is the ordering key whose head has held it longest while
	// messages wait behind it (tenant, key, head id, seconds); nil when
	// none waits.
	OldestHead *OldestHead `json:"oldest_head,omitempty"`
	// Depth is the number of rows per status.
	Depth map[string]int64 `json:"depth"`
	// TableState is the queue table's dead rows, vacuum and storage
	// options (its fields appear at this level in the JSON).
	TableState
	// Keys is the queue's ordering keys' table (leasing.Queue.KeyTable);
	// nil on a schema before migration 00010, which has none.
	Keys *KeyTableState `json:"keys,omitempty"`
	// Signal is the queue's work signal; nil on a schema before migration
	// 00009, which has no signal sequence.
	Signal *SignalState `json:"signal,omitempty"`
	// Problems and Warnings are this queue's findings, in words.
	Problems []string `json:"problems"`
	Warnings []string `json:"warnings"`
}

// TableState is a table's dead rows, vacuum and storage options.
type TableState struct {
	// DeadTuples and LiveTuples are PostgreSQL's estimates of dead and live
	// row versions in the table (pg_stat_user_tables).
	DeadTuples int64 `json:"dead_tuples"`
	LiveTuples int64 `json:"live_tuples"`
	// LastAutovacuum and LastVacuum are when VACUUM last finished on the
	// table; null when never since statistics were reset.
	LastAutovacuum *time.Time `json:"last_autovacuum"`
	LastVacuum     *time.Time `json:"last_vacuum"`
	// MayVacuum says whether the role doctor connected as may VACUUM the
	// table. Processors' vacuum policy (processor.VacuumPolicy) needs it
	// on both tables of a queue, the queue table and its ordering keys'
	// table: without it on either, it vacuums neither (it reports
	// leasing.ErrVacuumNotAllowed once) and leaves both to autovacuum.
	MayVacuum bool `json:"may_vacuum"`
	// StorageOptions are the table's reloptions, e.g. "fillfactor=80".
	StorageOptions []string `json:"storage_options"`
}

// autovacuumOff reports whether the table's storage options turn
// autovacuum off.
func (t TableState) autovacuumOff() bool {
	return slices.Contains(t.StorageOptions, "autovacuum_enabled=false") || slices.Contains(t.StorageOptions, "autovacuum_enabled=off")
}

// KeyTableState is a queue's ordering keys' table: its dead rows and
// vacuum, reported like the queue table's in QueueReport.
type KeyTableState struct {
	// Table is the table's name, e.g. "inbox_ordering_keys".
	Table string `json:"table"`
	TableState
}

// SignalState is a queue's work signal: the sequence that holds its
// budget (migration 00009) and the insert trigger's WHEN clause that reads
// it as the inserting role (migration 00014).
type SignalState struct {
	// Sequence is the sequence's name, e.g. "inbox_messages_work_signal".
	Sequence string `json:"sequence"`
	// Gated is true when the insert trigger tests the budget in its WHEN
	// clause (migration 00014 applied).
	Gated bool `json:"gated"`
	// MaySelect says whether the role doctor connected as may SELECT the
	// sequence. Without it, once Gated, each of its inserting statements
	// calls the trigger function, which costs producers throughput.
	MaySelect bool `json:"may_select"`
	// RolesWithoutSelect are the roles (quoted for a GRANT, in name
	// order, the built-in pg_* roles left out) that may insert into the
	// table but not SELECT the sequence: producers connecting as them pay
	// for the function call. Empty when there are none.
	RolesWithoutSelect []string `json:"roles_without_select"`
}

// maxRolesShown is how many roles a warning names.
const maxRolesShown = 10

// IndexState is one required index.
type IndexState struct {
	Name    string `json:"name"`
	Present bool   `json:"present"`
	// Valid is false for an index that queries cannot use, e.g. one left by
	// an interrupted CREATE INDEX CONCURRENTLY.
	Valid bool `json:"valid"`
}

// RequiredIndexes returns the indexes queue q's statements rely on: those
// the embedded migrations create on its table (db.Requirements, the list
// leasing.CheckSchema checks too), in migration order.
//
// Errors: those of db.Requirements.
func RequiredIndexes(q leasing.Queue) ([]string, error) {
	reqs, err := db.Requirements()
	if err != nil {
		return nil, err
	}
	var idx []string
	for _, r := range reqs {
		for _, ix := range r.Indexes {
			if ix.Table == q.Table() {
				idx = append(idx, ix.Name)
			}
		}
	}
	return idx, nil
}

// maxNaptime is the longest autovacuum_naptime doctor accepts without a
// warning.
const maxNaptime = 10 * time.Second

// smallTable is the row count below which a sequential scan or a sort in
// the claim plan is only a warning.
const smallTable = 10_000

// shippedOptions are the storage options db/migrations sets on both tables;
// doctor warns when one is missing.
var shippedOptions = []string{
	"fillfactor=80",
	"autovacuum_vacuum_scale_factor=0.0",
	"autovacuum_vacuum_threshold=5000",
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
	rep.OK = len(rep.Problems) == 0
	for _, qr := range rep.Queues {
		rep.OK = rep.OK && len(qr.Problems) == 0
	}
	return rep, nil
}

func checkQueue(ctx context.Context, pool *pgxpool.Pool, q leasing.Queue, opts Options, schemaBehind bool) (QueueReport, error) {
	g := gen.New()
	t := q.Table()
	qr := QueueReport{
		Queue: string(q), Table: t, Indexes: []IndexState{}, ClaimPlan: []string{}, ClaimIndexes: []string{},
		Depth: map[string]int64{}, TableState: TableState{StorageOptions: []string{}}, Problems: []string{}, Warnings: []string{},
	}
	problem := func(format string, args ...any) { qr.Problems = append(qr.Problems, fmt.Sprintf(format, args...)) }
	warn := func(format string, args ...any) { qr.Warnings = append(qr.Warnings, fmt.Sprintf(format, args...)) }

	table, found, err := readTable(ctx, pool, t)
	if err != nil {
		return qr, err
	}
	if !found {
		problem("table %s does not exist: run leasectl migrate up", t)
		return qr, nil
	}
	qr.TableState = table
	switch keys, found, err := readTable(ctx, pool, q.KeyTable()); {
	case err != nil:
		return qr, err
	case found: // none before migration 00010, which checkMigrations reports
		qr.Keys = &KeyTableState{Table: q.KeyTable(), TableState: keys}
	}
	switch {
	case qr.Keys == nil:
		if !qr.MayVacuum {
			warn("this role may not VACUUM %s: processors connecting as it leave the table to autovacuum (their vacuum policy reports leasing.ErrVacuumNotAllowed once); run them as the table owner, or a member that inherits its rights, to keep claims cheap under heavy churn", t)
		}
	case !qr.MayVacuum || !qr.Keys.MayVacuum:
		var denied []string
		if !qr.MayVacuum {
			denied = append(denied, t)
		}
		if !qr.Keys.MayVacuum {
			denied = append(denied, qr.Keys.Table)
		}
		warn("this role may not VACUUM %s: processors connecting as it leave %s and %s to autovacuum (their vacuum policy needs the owner's rights on both tables and reports leasing.ErrVacuumNotAllowed once); run them as the tables' owner, or a member that inherits its rights, to keep claims and keyed writes cheap under heavy churn",
			strings.Join(denied, " and "), t, qr.Keys.Table)
	}
	signal, err := g.DiagnosticsWorkSignalAccess(ctx, pool, gen.DiagnosticsWorkSignalAccessParams{TableName: t})
	if err != nil {
		return qr, fmt.Errorf("doctor: %s work signal: %w", t, err)
	}
	if signal.Present {
		qr.Signal = &SignalState{Sequence: signal.SequenceName, Gated: signal.Gated, MaySelect: signal.Selectable,
			RolesWithoutSelect: signal.RolesWithoutSelect}
		if roles := signal.RolesWithoutSelect; signal.Gated && len(roles) > 0 {
			shown := roles
			if len(shown) > maxRolesShown {
				shown = shown[:maxRolesShown]
			}
			more := ""
			if n := len(roles) - len(shown); n > 0 {
				more = fmt.Sprintf(" (and %s more)", plural.Count(n, "role", "roles"))
			}
			warn("%s may insert into %s but not SELECT the work signal's sequence %s, which the insert trigger's WHEN clause reads: each of their inserting statements calls the trigger function instead (as before migration 00014), which costs producers throughput; GRANT SELECT ON SEQUENCE %s TO %s%s, or run db/roles.sql, which grants it to leasestore_processor",
				plural.Count(len(roles), "role", "roles")+" ("+strings.Join(shown, ", ")+more+")", t, qr.Signal.Sequence, qr.Signal.Sequence, strings.Join(shown, ", "), more)
		}
	}

	indexes, err := g.DiagnosticsIndexes(ctx, pool, gen.DiagnosticsIndexesParams{TableName: t})
	if err != nil {
		return qr, fmt.Errorf("doctor: %s indexes: %w", t, err)
	}
	required, err := RequiredIndexes(q)
	if err != nil {
		return qr, fmt.Errorf("doctor: %w", err)
	}
	for _, name := range required {
		st := IndexState{Name: name}
		for _, ix := range indexes {
			if ix.IndexName == name {
				st.Present, st.Valid = true, ix.Valid && ix.Ready
			}
		}
		qr.Indexes = append(qr.Indexes, st)
		switch {
		case !st.Present:
			problem("index %s is missing: the statements that need it read the whole table; run leasectl migrate up, or recreate it as db/migrations defines it", name)
		case !st.Valid:
			problem("index %s is invalid (left by an interrupted CREATE INDEX CONCURRENTLY), so queries cannot use it: run REINDEX INDEX CONCURRENTLY %s", name, name)
		}
	}

	store, err := leasing.NewPostgres(pool, q, leasing.PostgresOptions{SkipSchemaCheck: true}) // checkMigrations and the index checks report the schema
	if err != nil {
		return qr, err
	}
	allowed, err := checkPrivileges(ctx, store, schemaBehind, problem, warn)
	if err != nil {
		return qr, fmt.Errorf("doctor: %s privileges: %w", t, err)
	}
	if allowed {
		err := checkBacklog(ctx, store, q, opts, schemaBehind, &qr, problem, warn)
		switch {
		case errors.Is(err, leasing.ErrPermissionDenied): // privileges not checked: the schema is behind
			problem("this role may not read the queue: %v; the depth, leases and claim plan were not checked", err)
		case err != nil:
			return qr, err
		}
	}

	if qr.DeadTuples > opts.MaxDeadTuples {
		problem("%d dead row versions (more than %d), last autovacuum %s: VACUUM is not keeping up or is held back (see the oldest transaction), and claims read the dead index entries",
			qr.DeadTuples, opts.MaxDeadTuples, ago(qr.LastAutovacuum))
	}
	if k := qr.Keys; k != nil && k.autovacuumOff() {
		problem("autovacuum is turned off for %s: its dead rows pile up and keyed writes slow down; ALTER TABLE %s RESET (autovacuum_enabled)", k.Table, k.Table)
	}
	if k := qr.Keys; k != nil && k.DeadTuples > opts.MaxDeadTuples {
		problem("%s holds %d dead row versions (more than %d), last autovacuum %s: VACUUM is not keeping up or is held back (see the oldest transaction), and keyed enqueues and outcome writes read the dead versions",
			k.Table, k.DeadTuples, opts.MaxDeadTuples, ago(k.LastAutovacuum))
	}
	if qr.autovacuumOff() {
		problem("autovacuum is turned off for %s: dead rows pile up and claims slow down; ALTER TABLE %s RESET (autovacuum_enabled)", t, t)
	}
	for _, want := range shippedOptions {
		if !slices.Contains(qr.StorageOptions, want) {
			warn("storage option %s of the shipped schema is not set on %s", want, t)
		}
	}
	return qr, nil
}

// schemaErrors are the SQLSTATEs of a statement that the schema does not
// fit: undefined_table, undefined_column, undefined_function.
var schemaErrors = []string{"42P01", "42703", "42883"}

// checkPrivileges runs store.CheckPrivileges, the check every processor
// runs before its first claim, and reports a refused call as a problem,
// and a statement the schema does not fit as a warning when behind (the
// migrations the statements need are not applied) or else as a problem,
// as it does any other error the server returned for a statement. It
// reports whether the checks that need the processors' privileges may be
// made. Errors: ErrLockTimeout (DDL holds a table), the connection's and
// the context's.
func checkPrivileges(ctx context.Context, store *leasing.Postgres, behind bool, problem, warn func(string, ...any)) (bool, error) {
	err := store.CheckPrivileges(ctx)
	var (
		pe    *leasing.PrivilegeError
		pgErr *pgconn.PgError
	)
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &pe):
		refused := make([]string, len(pe.Refused))
		for i, r := range pe.Refused {
			refused[i] = r.String()
		}
		problem("this role may not run every statement a processor sends: %s; a processor connecting as it claims nothing and its Run returns an error wrapping a *leasing.PrivilegeError; run db/roles.sql and log in as a member of leasestore_processor that inherits its rights, or grant what db/roles.sql grants leasestore_processor (the server names one missing table per call); the depth, leases and claim plan were not checked",
			strings.Join(refused, ", "))
		return false, nil
	case errors.Is(err, leasing.ErrLockTimeout), !errors.As(err, &pgErr):
		return false, err
	case slices.Contains(schemaErrors, pgErr.Code) && behind:
		warn("the processors' privileges were not checked: their statements need the migrations not applied yet (%s)", pgErr.Message)
		return true, nil
	case slices.Contains(schemaErrors, pgErr.Code):
		problem("a processor's statements do not fit this schema: %s; run leasectl migrate up, or recreate what is missing as db/migrations defines it; the depth, leases and claim plan were not checked", pgErr.Error())
		return false, nil
	}
	problem("a processor's statements fail on this database: %s; the depth, leases and claim plan were not checked", pgErr.Error())
	return false, nil
}

// checkBacklog reads q's depth, leases and longest-held key (Stats), the
// overdue check and, unless the schema is behind, the claim's plan and
// cost, into qr, reporting through problem and warn. It needs the
// privileges processors have on the queue's tables (checkPrivileges).
func checkBacklog(ctx context.Context, store *leasing.Postgres, q leasing.Queue, opts Options, schemaBehind bool, qr *QueueReport, problem, warn func(string, ...any)) error {
	g := gen.New()
	pool := store.Pool()
	stats, err := store.Stats(ctx)
	if err != nil {
		return fmt.Errorf("doctor: %w", err)
	}
	var rows int64
	for st, n := range stats.Depth {
		qr.Depth[string(st)] = n
		rows += n
	}
	qr.ExpiredLeases, qr.OldestDueSeconds = stats.ExpiredLeases, stats.OldestDueAge.Seconds()
	qr.DeadLettered = stats.Depth[leasing.StatusDeadLettered]
	qr.Waiting = stats.Depth[leasing.StatusWaiting]
	if h := stats.WaitingHead; h != nil {
		qr.OldestHead = &OldestHead{TenantID: h.TenantID, OrderingKey: h.OrderingKey, MessageID: h.MessageID.String(), AgeSeconds: h.Age.Seconds()}
	}
	// Time spent deferred, waiting on a retry delay or leased is not
	// waiting, so the oldest row's age alone would raise false alarms.
	overdue := g.DiagnosticsInboxOverdue
	if q == leasing.Outbox {
		overdue = func(ctx context.Context, db gen.DBTX, p gen.DiagnosticsInboxOverdueParams) (bool, error) {
			return g.DiagnosticsOutboxOverdue(ctx, db, gen.DiagnosticsOutboxOverdueParams(p))
		}
	}
	// The overdue check reads the queue table: READ COMMITTED and read
	// only, as the store's statements run, whatever the defaults.
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) (err error) {
		qr.Overdue, err = overdue(ctx, tx, gen.DiagnosticsInboxOverdueParams{MinDue: opts.MaxOldestDue})
		return err
	})
	if err != nil {
		return fmt.Errorf("doctor: %w", err)
	}
	if qr.Overdue {
		problem("a message has been due for more than %s (the oldest due one was created %s ago): no processor drains the queue, or it cannot keep up", opts.MaxOldestDue, round(stats.OldestDueAge))
	}
	if qr.ExpiredLeases > 0 {
		warn("%s: workers died or handlers outlive their lease; the next claim reclaims them",
			plural.Count(qr.ExpiredLeases, "lease expired and is not reclaimed yet", "leases expired and are not reclaimed yet"))
	}
	if qr.DeadLettered > 0 {
		warn("%s for an operator: fix the cause, then leasectl requeue --queue %s --all",
			plural.Count(qr.DeadLettered, "dead-lettered message waits", "dead-lettered messages wait"), q)
	}
	if h := stats.WaitingHead; h != nil && h.Age > opts.MaxOldestDue {
		warn("ordering key %q (tenant %q) has had head %s for %s while %s behind a head: %s; leasectl get --queue %s --id %s",
			h.OrderingKey, h.TenantID, h.MessageID, round(h.Age), plural.Count(qr.Waiting, "message of the queue waits", "messages of the queue wait"),
			headHeld(ctx, store, h.MessageID), q, h.MessageID)
	}

	if schemaBehind {
		warn("the claim's plan and cost were not checked: the claim needs the migrations not applied yet")
	} else if err := checkClaim(ctx, store, q, opts, rows, qr, problem, warn); err != nil {
		return err
	}

	return nil
}

// headHeld says why head holds its key, from its state: pending and not
// claimed (or not due yet), failed and waiting out its retry delay, in
// flight, dead-lettered under strict ordering, or parked by the claim with
// its key held (under strict ordering, or because freeing it failed:
// ParkedError.KeysNotFreed). A head Get cannot read (a row with an
// infinite time, which the claim parks) gets the causes a dead letter can
// have.
func headHeld(ctx context.Context, store *leasing.Postgres, head uuid.UUID) string {
	row, err := store.Get(ctx, head)
	if err != nil {
		return "a dead-lettered head, under strict ordering or parked by the claim (its row could not be read: " + err.Error() + ")"
	}
	switch row.Status {
	case leasing.StatusPending:
		if row.VisibleAfter.After(time.Now()) {
			return "the head is pending and not due before " + row.VisibleAfter.UTC().Format(time.RFC3339)
		}
		return "no processor has claimed the head (it is pending)"
	case leasing.StatusFailed:
		return "the head's handler failed and the head waits out its retry delay (it is failed)"
	case leasing.StatusDeadLettered:
	default:
		return "a slow handler holds the head (it is " + string(row.Status) + ")"
	}
	strict, err := store.StrictOrdering(ctx)
	switch parked := strings.HasPrefix(row.LastError, parkedPrefix); {
	case err != nil:
		return "the head is dead-lettered and holds its key: requeue or purge it"
	case parked && strict:
		return "the head was parked by the claim and holds its key (strict ordering): fix the row, then requeue it, or purge it"
	case parked:
		return "the head was parked by the claim and its key was not freed: fix the row, then requeue it, or purge it"
	case strict:
		return "the head is dead-lettered and holds its key (strict ordering): requeue or purge it"
	default:
		return "the head is dead-lettered but still holds its key: requeue or purge it"
	}
}

// parkedPrefix starts the last_error of a row the claim parked.
const parkedPrefix = "parked by the claim: "

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

// checkClaim explains a real claim of opts.BatchSize on store's queue
// (rolled back), custom and generic plan, fills qr's plan fields and
// reports, through problem and warn, a plan whose cost grows with the
// table or the backlog. rows is the table's row count: below smallTable a
// sequential scan or sort is the planner's right choice, only a warning.
// It needs every migration the claim reads.
func checkClaim(ctx context.Context, store *leasing.Postgres, q leasing.Queue, opts Options, rows int64, qr *QueueReport, problem, warn func(string, ...any)) error {
	t := q.Table()
	plan, err := explain.Claim(ctx, store.Pool(), q, opts.BatchSize, explain.Options{})
	if err != nil {
		return fmt.Errorf("doctor: %w", err)
	}
	qr.ClaimPlan, qr.ClaimIndexes, qr.ClaimBatch = plan.Nodes, plan.Indexes, opts.BatchSize
	qr.ClaimRows, qr.ClaimBuffers, qr.ClaimMs = plan.Rows, plan.Buffers, float64(plan.Duration.Microseconds())/1000
	qr.SeqScan, qr.SortOverEligible, qr.TempBlocks, qr.JIT = plan.SeqScan, plan.SortOverEligible, plan.TempBlocks, plan.JIT
	// On a small table a sequential scan or a sort is the planner's
	// cheapest choice, not a fault; it switches as the table grows. The
	// expiry probe reads one row at most, so a small table may answer it
	// with a sequential scan too.
	small := rows < smallTable
	used := []string{t + "_ready_idx", t + "_inflight_idx"}
	if !small {
		used = append(used, t+"_expiry_idx")
	}
	for _, name := range used {
		if !slices.Contains(plan.Indexes, name) {
			problem("the claim does not use index %s: its cost grows with the table instead of the batch", name)
		}
	}
	if plan.SeqScan {
		msg := fmt.Sprintf("the claim reads the whole table (Seq Scan): check the indexes above and run ANALYZE %s", t)
		if small {
			warn("%s; harmless while the table holds %d rows", msg, rows)
		} else {
			problem("%s", msg)
		}
	}
	if plan.SortOverEligible {
		msg := "the claim sorts every eligible row instead of reading them in index order: its cost grows with the backlog"
		if small {
			warn("%s; harmless while the table holds %d rows", msg, rows)
		} else {
			problem("%s", msg)
		}
	}
	if plan.TempBlocks > 0 {
		problem("the claim spilled %d blocks (8 KiB) to temporary files", plan.TempBlocks)
	}
	if plan.JIT {
		problem("PostgreSQL compiled the claim with JIT, which costs milliseconds per claim: raise jit_above_cost or set jit = off for the queue's role or database")
	}
	generic, err := explain.ClaimGeneric(ctx, store.Pool(), q, opts.BatchSize, explain.Options{})
	if err != nil {
		return fmt.Errorf("doctor: %w", err)
	}
	qr.GenericClaimBuffers, qr.GenericSeqScan, qr.GenericSortOverEligible = generic.Buffers, generic.SeqScan, generic.SortOverEligible
	if !small && (generic.SeqScan || generic.SortOverEligible) {
		problem("the claim's generic plan, the one leasing.Postgres runs every claim on, reads the whole table or sorts every eligible row (%d buffers): run ANALYZE %s, and report it if it stays", generic.Buffers, t)
	}
	if plan.Buffers > opts.MaxClaimBuffers {
		reason := "the table or its indexes carry dead entries at the FIFO head (see dead tuples and last autovacuum), or many due rows are locked by running claims"
		problem("a claim of %d touched %d shared buffers, more than %d: %s", opts.BatchSize, plan.Buffers, opts.MaxClaimBuffers, reason)
	}
	return nil
}

// checkMigrations fills rep's migrations from leasing.CheckSchema, the
// check every leasing.Postgres runs before its first claim, and reports each
// migration not applied as a problem (the indexes are checked per queue).
func checkMigrations(ctx context.Context, pool *pgxpool.Pool, opts Options, rep *Report) error {
	reqs, err := db.Requirements()
	if err != nil {
		return fmt.Errorf("doctor: %w", err)
	}
	var schemaErr *leasing.SchemaError
	err = leasing.CheckSchema(ctx, pool, opts.Queues...)
	if err != nil && !errors.As(err, &schemaErr) {
		return fmt.Errorf("doctor: %w", err)
	}
	var missing []string
	if schemaErr != nil {
		missing = schemaErr.Migrations
	}
	rep.MigrationHistory = schemaErr == nil || !schemaErr.NoHistory
	readable, err := gen.New().DiagnosticsRelationAccess(ctx, pool, gen.DiagnosticsRelationAccessParams{RelationName: db.VersionTable})
	if err != nil {
		return fmt.Errorf("doctor: %w", err)
	}
	if rep.MigrationHistory && !readable.Readable {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf(
			"this role may not read %s, so the migrations applied are unknown (only the indexes were checked): run doctor as the tables' owner", db.VersionTable))
		return nil
	}
	for _, r := range reqs {
		rep.Migrations = append(rep.Migrations, MigrationState{Name: r.Name, Applied: !slices.Contains(missing, r.Name)})
	}
	if !rep.MigrationHistory {
		rep.Problems = append(rep.Problems, fmt.Sprintf(
			"the migration history table %s does not exist: the database was never migrated, or by a version that kept the history in goose_db_version; run leasectl migrate up (it moves an old history)", db.VersionTable))
	} else if len(missing) > 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf(
			"migrations not applied: %s; stores of this version refuse to claim until they are (leasing.SchemaError): run leasectl migrate up",
			strings.Join(missing, ", ")))
	}
	return nil
}

func checkServer(ctx context.Context, pool *pgxpool.Pool, opts Options, rep *Report) error {
	g := gen.New()
	settings, err := g.DiagnosticsSettings(ctx, pool)
	if err != nil {
		return fmt.Errorf("doctor: settings: %w", err)
	}
	set := map[string]string{}
	for _, s := range settings {
		set[s.Name] = s.Setting
	}
	rep.Autovacuum = set["autovacuum"] == "on"
	if naptime, err := time.ParseDuration(set["autovacuum_naptime"] + "s"); err == nil {
		rep.AutovacuumNaptimeSeconds = naptime.Seconds()
	}
	if !rep.Autovacuum {
		rep.Problems = append(rep.Problems, "autovacuum is off for the whole server, so the queue tables' autovacuum settings never apply: dead entries pile up at the claim head and claims slow down with every message processed; turn autovacuum on, or VACUUM the queue tables on a schedule")
	}
	if set["track_counts"] == "off" {
		rep.Problems = append(rep.Problems, "track_counts is off: autovacuum cannot tell when the queue tables need vacuuming")
	}
	if rep.Autovacuum && rep.AutovacuumNaptimeSeconds > maxNaptime.Seconds() {
		rep.Warnings = append(rep.Warnings, fmt.Sprintf(
			"autovacuum visits each database every %s: at high throughput dead entries at the claim head pile up between visits; autovacuum_naptime = %s keeps claims cheaper",
			time.Duration(rep.AutovacuumNaptimeSeconds*float64(time.Second)), maxNaptime))
	}
	xacts, err := g.DiagnosticsOldestXact(ctx, pool)
	if err != nil {
		return fmt.Errorf("doctor: oldest transaction: %w", err)
	}
	if len(xacts) > 0 {
		x := xacts[0]
		rep.OldestXactSeconds, rep.OldestXactPID = x.XactAge.Seconds(), x.Pid
		rep.OldestXactState, rep.OldestXactApplication = x.State, x.ApplicationName
		if x.XactAge > opts.MaxXactAge {
			rep.Problems = append(rep.Problems, fmt.Sprintf(
				"session %d (%s, application %q) has held a snapshot for %s, more than %s: VACUUM cannot remove rows that died since, so dead entries pile up at the claim head; end the transaction (or SELECT pg_terminate_backend(%d))",
				x.Pid, x.State, x.ApplicationName, round(x.XactAge), opts.MaxXactAge, x.Pid))
		}
	}
	prepared, err := g.DiagnosticsPreparedXacts(ctx, pool)
	if err != nil {
		return fmt.Errorf("doctor: prepared transactions: %w", err)
	}
	rep.PreparedXacts, rep.OldestPreparedSeconds = prepared.Prepared, prepared.OldestAge.Seconds()
	if prepared.Prepared > 0 && prepared.OldestAge > opts.MaxXactAge {
		rep.Problems = append(rep.Problems, fmt.Sprintf(
			"%d prepared transactions, the oldest %s old: they hold back VACUUM until COMMIT PREPARED or ROLLBACK PREPARED (see pg_prepared_xacts)",
			prepared.Prepared, round(prepared.OldestAge)))
	}
	slots, err := g.DiagnosticsReplicationSlots(ctx, pool)
	if err != nil {
		return fmt.Errorf("doctor: replication slots: %w", err)
	}
	for _, s := range slots {
		msg := fmt.Sprintf("replication slot %s holds back VACUUM by %d transactions", s.SlotName, s.XminAge)
		if s.Active {
			rep.Warnings = append(rep.Warnings, msg)
		} else {
			rep.Problems = append(rep.Problems, msg+" and is inactive: drop it with pg_drop_replication_slot if nothing will use it")
		}
	}
	return nil
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
	return rep.OK, WriteText(out, rep)
}

// WriteText writes rep for people.
func WriteText(w io.Writer, rep Report) error {
	var b strings.Builder
	for _, q := range rep.Queues {
		status := "ok"
		if len(q.Problems) > 0 {
			status = plural.Count(len(q.Problems), "problem", "problems")
		}
		fmt.Fprintf(&b, "%s (%s): %s\n", q.Queue, q.Table, status)
		var idx []string
		for _, i := range q.Indexes {
			state := "valid"
			switch {
			case !i.Present:
				state = "MISSING"
			case !i.Valid:
				state = "INVALID"
			}
			idx = append(idx, i.Name+" "+state)
		}
		fmt.Fprintf(&b, "  indexes: %s\n", strings.Join(idx, ", "))
		if len(q.ClaimPlan) > 0 {
			fmt.Fprintf(&b, "  claim of %d: %d rows, %d buffers, %.3f ms; seq scan %t, sort over eligible %t, temp blocks %d, JIT %t; generic plan %d buffers\n",
				q.ClaimBatch, q.ClaimRows, q.ClaimBuffers, q.ClaimMs, q.SeqScan, q.SortOverEligible, q.TempBlocks, q.JIT, q.GenericClaimBuffers)
			for _, n := range q.ClaimPlan {
				fmt.Fprintf(&b, "    %s\n", n)
			}
			fmt.Fprintf(&b, "  expired leases %d, oldest due %s, overdue %t, dead-lettered %d\n",
				q.ExpiredLeases, round(time.Duration(q.OldestDueSeconds*float64(time.Second))), q.Overdue, q.DeadLettered)
			if h := q.OldestHead; h != nil {
				fmt.Fprintf(&b, "  waiting behind their keys %d; longest-held key %q (tenant %q): head %s for %s\n",
					q.Waiting, h.OrderingKey, h.TenantID, h.MessageID, round(time.Duration(h.AgeSeconds*float64(time.Second))))
			}
		}
		// The tables' state and the signal are read whatever the role may
		// do with the rows, so they are printed even when the checks above
		// were skipped; not for a table that does not exist (its report
		// lists no index).
		if len(q.Indexes) > 0 {
			fmt.Fprintf(&b, "  dead tuples %d (live %d), last autovacuum %s, last vacuum %s, this role may vacuum %t\n",
				q.DeadTuples, q.LiveTuples, ago(q.LastAutovacuum), ago(q.LastVacuum), q.MayVacuum)
		}
		if k := q.Keys; k != nil {
			fmt.Fprintf(&b, "  %s: dead tuples %d (live %d), last autovacuum %s, last vacuum %s, this role may vacuum %t\n",
				k.Table, k.DeadTuples, k.LiveTuples, ago(k.LastAutovacuum), ago(k.LastVacuum), k.MayVacuum)
		}
		if sig := q.Signal; sig != nil {
			fmt.Fprintf(&b, "  work signal: sequence %s, read by the insert trigger's WHEN clause %t, this role may read it %t, roles that may insert but not read it %d\n",
				sig.Sequence, sig.Gated, sig.MaySelect, len(sig.RolesWithoutSelect))
		}
		for _, p := range q.Problems {
			fmt.Fprintf(&b, "  problem: %s\n", p)
		}
		for _, p := range q.Warnings {
			fmt.Fprintf(&b, "  warning: %s\n", p)
		}
	}
	applied := 0
	var missing []string
	for _, m := range rep.Migrations {
		if m.Applied {
			applied++
		} else {
			missing = append(missing, m.Name)
		}
	}
	switch {
	case len(rep.Migrations) == 0:
		fmt.Fprintf(&b, "migrations: unknown (the history is not readable)\n")
	case len(missing) == 0:
		fmt.Fprintf(&b, "migrations: all %d applied\n", applied)
	default:
		fmt.Fprintf(&b, "migrations: %d of %d applied; MISSING %s\n", applied, len(rep.Migrations), strings.Join(missing, ", "))
	}
	if rep.OldestXactPID != 0 {
		fmt.Fprintf(&b, "oldest snapshot holding back cleanup: %s (session %d, %s)\n",
			round(time.Duration(rep.OldestXactSeconds*float64(time.Second))), rep.OldestXactPID, rep.OldestXactState)
	} else {
		fmt.Fprintf(&b, "oldest snapshot holding back cleanup: none\n")
	}
	for _, p := range rep.Problems {
		fmt.Fprintf(&b, "problem: %s\n", p)
	}
	for _, p := range rep.Warnings {
		fmt.Fprintf(&b, "warning: %s\n", p)
	}
	if rep.OK {
		fmt.Fprintf(&b, "OK\n")
	} else {
		fmt.Fprintf(&b, "NOT OK\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// ago says how long ago t was, or "never".
func ago(t *time.Time) string {
	if t == nil {
		return "never"
	}
	return round(time.Since(*t)) + " ago"
}

func round(d time.Duration) string {
	switch {
	case d >= time.Minute:
		return d.Round(time.Second).String()
	case d >= time.Second:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}
