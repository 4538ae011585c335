package doctor

// The findings doctor reports, in words: each names what is wrong, why it
// matters and what to do. They are fmt formats; the comment above each
// group names the arguments in order.

// The queue table and its indexes: table (and index) names.
const (
	msgTableMissing = "table %s does not exist: run leasectl migrate up"
	msgIndexMissing = "index %s is missing: the statements that need it read the whole table; run leasectl migrate up, or recreate it as db/migrations defines it"
	msgIndexInvalid = "index %[1]s is invalid (left by an interrupted CREATE INDEX CONCURRENTLY), so queries cannot use it: run REINDEX INDEX CONCURRENTLY %[1]s"
)

// The migrations: the history table's name, or the missing migrations.
const (
	msgHistoryUnreadable = "this role may not read %s, so the migrations applied are unknown (only the indexes were checked): run doctor as the tables' owner"
	msgHistoryMissing    = "the migration history table %s does not exist: the database was never migrated, or by a version that kept the history in goose_db_version; run leasectl migrate up (it moves an old history)"
	msgMigrationsMissing = "migrations not applied: %s; stores of this version refuse to claim until they are (leasing.SchemaError): run leasectl migrate up"
)

// The role's right to VACUUM: the queue table; or the tables refused, the
// queue table and its ordering keys' table.
const (
	msgVacuumRefused     = "this role may not VACUUM %s: processors connecting as it leave the table to autovacuum and say so once (info), which is fine at moderate churn; to have them vacuum it (cheaper claims under heavy churn), rerun db/roles.sql on PostgreSQL 17+ (it grants leasestore_processor MAINTAIN) or run them as the table's owner; processor.VacuumPolicy.Disabled silences them"
	msgVacuumRefusedKeys = "this role may not VACUUM %s: processors connecting as it leave %s and %s to autovacuum and say so once (info), which is fine at moderate churn; to have them vacuum both (cheaper claims and keyed writes under heavy churn), rerun db/roles.sql on PostgreSQL 17+ (it grants leasestore_processor MAINTAIN) or run them as the tables' owner; processor.VacuumPolicy.Disabled silences them"
)

// The work signal: the count of roles, the roles shown, msgMoreRoles or
// nothing, the queue table, the sequence.
const (
	msgSignalNotReadable = "%[1]s (%[2]s%[3]s) may insert into %[4]s but not SELECT the work signal's sequence %[5]s, which the insert trigger's WHEN clause reads: each of their inserting statements calls the trigger function instead (as before migration 00014), which costs producers throughput; GRANT SELECT ON SEQUENCE %[5]s TO %[2]s%[3]s, or run db/roles.sql, which grants it to leasestore_processor"
	msgMoreRoles         = " (and %s more)"
)

// The processors' privileges: the refused statements, the read error, or
// the server's message.
const (
	msgPrivilegesRefused  = "this role may not run every statement a processor sends: %s; a processor connecting as it claims nothing and its Run returns an error wrapping a *leasing.PrivilegeError; run db/roles.sql and log in as a member of leasestore_processor that inherits its rights, or grant what db/roles.sql grants leasestore_processor (the server names one missing table per call); the depth, leases and claim plan were not checked"
	msgQueueUnreadable    = "this role may not read the queue: %v; the depth, leases and claim plan were not checked"
	msgPrivilegesNotYet   = "the processors' privileges were not checked: their statements need the migrations not applied yet (%s)"
	msgStatementsUnfit    = "a processor's statements do not fit this schema: %s; run leasectl migrate up, or recreate what is missing as db/migrations defines it; the depth, leases and claim plan were not checked"
	msgStatementsFail     = "a processor's statements fail on this database: %s; the depth, leases and claim plan were not checked"
	msgClaimNotYetChecked = "the claim's plan and cost were not checked: the claim needs the migrations not applied yet"
)

// The backlog: the threshold and the oldest due message's age; the count
// of expired leases or dead letters (plural.Count) and the queue; the
// longest-held key, tenant, head, age, waiting count, why the head holds
// the key (msgHead*), queue.
const (
	msgOverdue     = "a message has been due for more than %s (the oldest due one was created %s ago): no processor drains the queue, or it cannot keep up"
	msgExpired     = "%s: workers died or handlers outlive their lease; the next claim reclaims them"
	msgExpiredOne  = "lease expired and is not reclaimed yet"
	msgExpiredMany = "leases expired and are not reclaimed yet"
	msgDeadLetters = "%s for an operator: fix the cause, then leasectl requeue --queue %s --all"
	msgDeadOne     = "dead-lettered message waits"
	msgDeadMany    = "dead-lettered messages wait"
	msgKeyHeld     = "ordering key %q (tenant %q) has had head %[3]s for %s while %s behind a head: %s; leasectl get --queue %s --id %[3]s"
	msgWaitingOne  = "message of the queue waits"
	msgWaitingMany = "messages of the queue wait"
)

// Pauses: the read error; who paused the whole queue, when (RFC 3339),
// the oldest due message's age, the queue.
const (
	msgPausesUnreadable = "this role may not read the pauses (leasestore_paused): %v; pauses in place are not shown"
	msgQueuePausedDue   = "the whole queue is paused (by %s at %s) while messages are due (the oldest due one was created %s ago): no processor claims them until leasectl resume --queue %s"
)

// Why a head holds its key, from its state.
const (
	msgHeadUnreadable     = "a dead-lettered head, under strict ordering or parked by the claim (its row could not be read: %s)"
	msgHeadNotDue         = "the head is pending and not due before %s"
	msgHeadPending        = "no processor has claimed the head (it is pending)"
	msgHeadRetrying       = "the head's handler failed and the head waits out its retry delay (it is failed)"
	msgHeadInFlight       = "a slow handler holds the head (it is %s)"
	msgHeadDead           = "the head is dead-lettered and holds its key: requeue or purge it"
	msgHeadParkedStrict   = "the head was parked by the claim and holds its key (strict ordering): fix the row, then requeue it, or purge it"
	msgHeadParkedNotFreed = "the head was parked by the claim and its key was not freed: fix the row, then requeue it, or purge it"
	msgHeadDeadStrict     = "the head is dead-lettered and holds its key (strict ordering): requeue or purge it"
	msgHeadDeadKeyHeld    = "the head is dead-lettered but still holds its key: requeue or purge it"
)

// The claim's plan: index or table names, counts of rows, blocks and
// buffers; msgSmallTable follows a finding a small table excuses.
const (
	msgClaimIndexUnused = "the claim does not use index %s: its cost grows with the table instead of the batch"
	msgClaimSeqScan     = "the claim reads the whole table (Seq Scan): check the indexes above and run ANALYZE %s"
	msgClaimSorts       = "the claim sorts every eligible row instead of reading them in index order: its cost grows with the backlog"
	msgSmallTable       = "%s; harmless while the table holds %d rows"
	msgClaimSpilled     = "the claim spilled %d blocks (8 KiB) to temporary files"
	msgClaimJIT         = "PostgreSQL compiled the store's claim with JIT, which costs tens of milliseconds per claim, although the store turns JIT off for it: set jit = off for the queue's role or database, and report it"
	msgGenericPlan      = "the claim's generic plan, the one leasing.Postgres runs every claim on, reads the whole table or sorts every eligible row (%d buffers): run ANALYZE %s, and report it if it stays"
	msgClaimBuffers     = "a claim of %d touched %d shared buffers, more than %d: the table or its indexes carry dead entries at the FIFO head (see dead tuples and last autovacuum), or many due rows are locked by running claims"
)

// Dead rows and storage options: counts, threshold, last autovacuum (ago),
// table names, storage option.
const (
	msgDeadTuples        = "%d dead row versions (more than %d), last autovacuum %s: VACUUM is not keeping up or is held back (see the oldest transaction), and claims read the dead index entries"
	msgKeysDeadTuples    = "%s holds %d dead row versions (more than %d), last autovacuum %s: VACUUM is not keeping up or is held back (see the oldest transaction), and keyed enqueues and outcome writes read the dead versions"
	msgAutovacuumOff     = "autovacuum is turned off for %[1]s: dead rows pile up and claims slow down; ALTER TABLE %[1]s RESET (autovacuum_enabled)"
	msgKeysAutovacuumOff = "autovacuum is turned off for %[1]s: its dead rows pile up and keyed writes slow down; ALTER TABLE %[1]s RESET (autovacuum_enabled)"
	msgStorageOption     = "storage option %s of the shipped schema is not set on %s"
)

// The server: the naptime and its advised bound; the oldest snapshot's
// session, state, application, age and threshold; prepared transactions'
// count and age; a replication slot's name and age in transactions.
const (
	msgAutovacuumOffServer = "autovacuum is off for the whole server, so the queue tables' autovacuum settings never apply: dead entries pile up at the claim head and claims slow down with every message processed; turn autovacuum on, or VACUUM the queue tables on a schedule"
	msgTrackCountsOff      = "track_counts is off: autovacuum cannot tell when the queue tables need vacuuming"
	msgNaptime             = "autovacuum visits each database every %s: at high throughput dead entries at the claim head pile up between visits; autovacuum_naptime = %s keeps claims cheaper"
	msgOldSnapshot         = "session %[1]d (%[2]s, application %[3]q) has held a snapshot for %[4]s, more than %[5]s: VACUUM cannot remove rows that died since, so dead entries pile up at the claim head; end the transaction (or SELECT pg_terminate_backend(%[1]d))"
	msgOldPrepared         = "%d prepared transactions, the oldest %s old: they hold back VACUUM until COMMIT PREPARED or ROLLBACK PREPARED (see pg_prepared_xacts)"
	msgSlot                = "replication slot %s holds back VACUUM by %d transactions"
	msgSlotInactive        = msgSlot + " and is inactive: drop it with pg_drop_replication_slot if nothing will use it"
)

// Replication, for the inbox: the number of standbys; synchronous_commit
// and synchronous_standby_names.
const (
	msgInboxAsyncReplication = "the inbox runs on asynchronous replication (%d standby streaming, synchronous_standby_names empty): a failover loses the last commits, among them inbox messages whose broker was already told they were accepted; set synchronous_standby_names, or acknowledge the broker only after a durable commit (docs/high-availability.md)"
	msgInboxLocalCommit      = "synchronous_commit is %s for this role and database although synchronous_standby_names is %q: inbox commits do not wait for the standby, so a failover loses the last ones, among them messages whose broker was already told they were accepted; use synchronous_commit = on (docs/high-availability.md)"
	msgInboxNoSyncStandby    = "synchronous_standby_names is %q but none of the %d streaming standbys is synchronous: commits wait for a standby that is not there (or for none, under a quorum that is not met); check the standbys' application_name (docs/high-availability.md)"
)
