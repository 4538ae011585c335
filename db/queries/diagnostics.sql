-- DiagnosticsAppliedMigrations returns the leasestore migration versions
-- that goose's history (leasestore_db_version, db.VersionTable) records as
-- applied, ascending. The latest row of a version decides: goose versions
-- that recorded a down migration as a row with is_applied false leave the
-- earlier row behind. Version 0 is goose's own first row. Fails (42P01)
-- when the table does not exist, or 42501 when the role may not read it:
-- check DiagnosticsRelationAccess first.
-- name: DiagnosticsAppliedMigrations :many
SELECT v.version_id::bigint AS version_id
FROM (SELECT DISTINCT ON (h.version_id) h.version_id, h.is_applied
      FROM leasestore_db_version AS h
      ORDER BY h.version_id, h.id DESC) AS v
WHERE v.is_applied
ORDER BY v.version_id;

-- DiagnosticsIndexStates returns one row per name in index_names, in input
-- order: whether an index of that name exists (resolved through
-- search_path, like the queue queries' tables), whether it is valid and
-- ready (false after an interrupted CREATE INDEX CONCURRENTLY), and the
-- table it indexes ('' when absent).
-- name: DiagnosticsIndexStates :many
SELECT n.name::text AS index_name,
       (i.indexrelid IS NOT NULL)::boolean AS present,
       coalesce(i.indisvalid AND i.indisready, false)::boolean AS valid,
       coalesce(t.relname, '')::text AS table_name
FROM unnest(@index_names::text[]) WITH ORDINALITY AS n(name, ord)
LEFT JOIN pg_catalog.pg_index AS i ON i.indexrelid = to_regclass(n.name)
LEFT JOIN pg_catalog.pg_class AS t ON t.oid = i.indrelid
ORDER BY n.ord;

-- DiagnosticsIndexes returns every index on table_name, ordered by name, with
-- valid (queries may use it; false after an interrupted CREATE INDEX
-- CONCURRENTLY) and ready (writes maintain it). Empty when there is no such
-- table.
-- name: DiagnosticsIndexes :many
    -- Read-only catalog queries behind leasectl doctor. to_regclass resolves
    -- table names through search_path, like the queue queries; the casts give
    -- sqlc the types it cannot infer from pg_catalog views.
SELECT c.relname::text AS index_name,
       i.indisvalid::boolean AS valid,
       i.indisready::boolean AS ready
FROM pg_catalog.pg_index AS i
JOIN pg_catalog.pg_class AS c ON c.oid = i.indexrelid
WHERE i.indrelid = to_regclass(@table_name::text)
ORDER BY c.relname;

-- DiagnosticsOldestXact returns the open transaction or session whose
-- snapshot (backend_xmin) is oldest, as seen from this database: VACUUM
-- cannot remove rows that died after it started. xact_age is now minus
-- xact_start (or backend_start when no transaction is open). Autovacuum
-- workers and the calling session are left out. Empty when no other session
-- holds a snapshot.
-- name: DiagnosticsOldestXact :many
SELECT a.pid::integer AS pid,
       coalesce(a.state, '')::text AS state,
       coalesce(a.application_name, '')::text AS application_name,
       coalesce(a.backend_type, '')::text AS backend_type,
       (statement_timestamp() - coalesce(a.xact_start, a.backend_start, statement_timestamp()))::interval AS xact_age
FROM pg_catalog.pg_stat_activity AS a
WHERE a.backend_xmin IS NOT NULL
  AND a.pid <> pg_backend_pid()
  AND coalesce(a.backend_type, '') <> 'autovacuum worker'
  AND (a.datname IS NULL OR a.datname = current_database())
ORDER BY xact_age DESC, a.pid
LIMIT 1;

-- DiagnosticsPreparedXacts returns the number of prepared (two-phase)
-- transactions in this database and the age of the oldest, 0 when none.
-- A forgotten prepared transaction holds back VACUUM like an open one.
-- name: DiagnosticsPreparedXacts :one
SELECT count(*)::bigint AS prepared,
       coalesce(statement_timestamp() - min(p.prepared), '0'::interval)::interval AS oldest_age
FROM pg_catalog.pg_prepared_xacts AS p
WHERE p.database = current_database();

-- DiagnosticsRelationAccess reports whether a table (or view) named
-- relation_name exists, resolved through search_path, and whether the
-- current role may SELECT from it.
-- name: DiagnosticsRelationAccess :one
SELECT (to_regclass(@relation_name::text) IS NOT NULL)::boolean AS present,
       coalesce(has_table_privilege(to_regclass(@relation_name::text), 'SELECT'), false)::boolean AS readable;

-- DiagnosticsReplicationSlots returns the replication slots that hold back
-- VACUUM of user tables (xmin set), with xmin_age in transactions
-- (age(xmin)), ordered by slot name.
-- name: DiagnosticsReplicationSlots :many
SELECT s.slot_name::text AS slot_name,
       s.active::boolean AS active,
       age(s.xmin)::bigint AS xmin_age
FROM pg_catalog.pg_replication_slots AS s
WHERE s.xmin IS NOT NULL
ORDER BY s.slot_name;

-- DiagnosticsSettings returns the server settings that decide whether dead
-- rows of the queue tables are cleaned up in time and whether claims pay
-- for JIT, ordered by name: setting as text, unit ('' when none).
-- name: DiagnosticsSettings :many
SELECT s.name::text AS name,
       s.setting::text AS setting,
       coalesce(s.unit, '')::text AS unit
FROM pg_catalog.pg_settings AS s
WHERE s.name IN ('autovacuum', 'autovacuum_naptime', 'track_counts', 'jit', 'jit_above_cost')
ORDER BY s.name;

-- DiagnosticsTableHealth returns table_name's statistics: estimated dead
-- and live tuples, the last manual and automatic VACUUM and ANALYZE (NULL
-- when never), how many VACUUMs of each kind ran since the statistics were
-- reset, and its storage options (reloptions, e.g. fillfactor=80).
-- pgx.ErrNoRows when there is no such table.
-- name: DiagnosticsTableHealth :one
SELECT s.n_dead_tup::bigint AS dead_tuples,
       s.n_live_tup::bigint AS live_tuples,
       s.last_vacuum,
       s.last_autovacuum,
       s.last_analyze,
       s.last_autoanalyze,
       s.vacuum_count::bigint AS vacuum_count,
       s.autovacuum_count::bigint AS autovacuum_count,
       coalesce(c.reloptions, '{}'::text[])::text[] AS reloptions
FROM pg_catalog.pg_stat_user_tables AS s
JOIN pg_catalog.pg_class AS c ON c.oid = s.relid
WHERE s.relid = to_regclass(@table_name::text);

-- DiagnosticsWorkSignalAccess reports, for the work signal of table_name
-- (migrations 00009 and 00014), whether its sequence
-- <table_name>_work_signal exists, whether the table's insert trigger
-- <table_name>_notify_work tests the signal's budget in a WHEN clause
-- (00014; 00009's trigger has none), whether the current role may SELECT
-- the sequence, and which roles may INSERT into the table but not SELECT
-- the sequence (quoted for a GRANT, in name order; the built-in pg_*
-- roles left out). The WHEN clause runs as the inserting role: a role
-- without SELECT calls the trigger function on every inserting statement
-- instead. sequence_name is '' when absent. Names resolve through
-- search_path, like the queue queries'. Reads every role: for doctor.
-- name: DiagnosticsWorkSignalAccess :one
SELECT (s.oid IS NOT NULL)::boolean AS present,
       coalesce(s.oid::regclass::text, '')::text AS sequence_name,
       EXISTS (SELECT 1 FROM pg_catalog.pg_trigger AS g
               WHERE g.tgrelid = to_regclass(@table_name::text)
                 AND g.tgname = @table_name::text || '_notify_work'
                 AND g.tgqual IS NOT NULL)::boolean AS gated,
       coalesce(has_sequence_privilege(s.oid, 'SELECT'), false)::boolean AS selectable,
       coalesce((SELECT array_agg(quote_ident(r.rolname) ORDER BY r.rolname)
                 FROM pg_catalog.pg_roles AS r
                 WHERE s.oid IS NOT NULL
                   AND r.rolname !~ '^pg_'
                   AND has_table_privilege(r.oid, to_regclass(@table_name::text), 'INSERT')
                   AND NOT has_sequence_privilege(r.oid, s.oid, 'SELECT')),
                '{}')::text[] AS roles_without_select
FROM (SELECT to_regclass(@table_name::text || '_work_signal')::oid AS oid) AS s;
