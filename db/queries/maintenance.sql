-- VacuumState returns, for table_name, the dead row versions the
-- statistics count (n_dead_tup; backends report theirs about once a
-- second), whether a VACUUM of it is running now (autovacuum's or another
-- process's, as far as this user may see), and whether the current user
-- may VACUUM it (has the privileges of the table owner's role or of the
-- database owner's, as VACUUM checks them: USAGE, so a NOINHERIT member
-- does not count; superusers have every role's; on PostgreSQL 17 and later
-- also the MAINTAIN privilege on it, which db/roles.sql grants
-- leasestore_processor there), the live rows they count
-- (n_live_tup) and whether the table was ever analysed, by ANALYZE or
-- autovacuum (as far as the statistics remember: a reset forgets).
-- pgx.ErrNoRows when there is no such table.
-- name: VacuumState :one
SELECT s.n_dead_tup::bigint AS dead_rows,
       s.n_live_tup::bigint AS live_rows,
       (s.last_analyze IS NOT NULL OR s.last_autoanalyze IS NOT NULL)::boolean AS analyzed,
       EXISTS (SELECT 1 FROM pg_catalog.pg_stat_progress_vacuum AS p
               WHERE p.relid = s.relid)::boolean AS running,
       (pg_catalog.pg_has_role(c.relowner, 'USAGE')
        OR pg_catalog.pg_has_role(d.datdba, 'USAGE')
        -- CASE, not AND: before 17 the privilege name is an error.
        OR CASE WHEN pg_catalog.current_setting('server_version_num')::integer >= 170000
                THEN pg_catalog.has_table_privilege(s.relid, 'MAINTAIN') ELSE false END)::boolean AS may_vacuum
FROM pg_catalog.pg_stat_user_tables AS s
JOIN pg_catalog.pg_class AS c ON c.oid = s.relid
JOIN pg_catalog.pg_database AS d ON d.datname = current_database()
WHERE s.relid = to_regclass(@table_name::text);
