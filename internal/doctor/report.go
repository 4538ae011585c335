package doctor

import (
	"slices"
	"time"
)

// Report is the outcome of Check. Times are UTC; ages are in seconds.
type Report struct {
	// OK is true when no queue and no server check found a problem.
	OK bool `json:"ok"`
	// ShowPlans makes WriteText print each claim plan's tree (Options.Plans);
	// the JSON always holds them.
	ShowPlans bool `json:"-"`
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
	// Replication is the replication the server shows.
	Replication ReplicationReport `json:"replication"`
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
	// SeqScan, SortOverEligible and TempBlocks are the plan warnings of
	// explain.ClaimPlan.
	SeqScan          bool  `json:"seq_scan"`
	SortOverEligible bool  `json:"sort_over_eligible"`
	TempBlocks       int64 `json:"temp_blocks"`
	// JIT is whether PostgreSQL compiled the generic claim, run with the
	// store's settings, with JIT: never while the store turns JIT off for
	// its claims, as it does.
	JIT bool `json:"jit"`
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
	// RetainedSeconds is how far back the stored finished (completed or
	// published) rows reach, leasing.Retained.FinishedWindow in seconds;
	// 0 when none is stored. On the inbox it is the effective dedup
	// window: the idempotency keys of messages finished since are still
	// stored. RetainedDeadSeconds is the same for dead letters.
	RetainedSeconds     float64 `json:"retained_seconds"`
	RetainedDeadSeconds float64 `json:"retained_dead_seconds"`
	// Paused lists the pauses in place (leasectl pause), the whole-queue
	// pause (Topic "") first; empty when none (or before migration 00015).
	// A pause is not a problem; a whole-queue pause while messages are due
	// is a warning, and then an overdue message is not a problem.
	Paused []PauseState `json:"paused"`
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

// IndexState is one required index.
type IndexState struct {
	Name    string `json:"name"`
	Present bool   `json:"present"`
	// Valid is false for an index that queries cannot use, e.g. one left by
	// an interrupted CREATE INDEX CONCURRENTLY.
	Valid bool `json:"valid"`
}
