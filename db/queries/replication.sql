-- DiagnosticsReplication returns, from the connected server's view,
-- whether it is a standby (in recovery), its synchronous_standby_names and
-- synchronous_commit (the connected role's and database's values), and
-- its streaming standbys: all of them, those it waits for (sync or
-- quorum) and those whose state the role may not see (NULL sync_state
-- without pg_read_all_stats).
-- name: DiagnosticsReplication :one
SELECT pg_catalog.pg_is_in_recovery() AS in_recovery,
       pg_catalog.current_setting('synchronous_standby_names')::text AS synchronous_standby_names,
       pg_catalog.current_setting('synchronous_commit')::text AS synchronous_commit,
       count(r.pid)::bigint AS standbys,
       (count(r.pid) FILTER (WHERE r.sync_state IN ('sync', 'quorum')))::bigint AS synchronous_standbys,
       (count(r.pid) FILTER (WHERE r.sync_state IS NULL))::bigint AS hidden_standbys
FROM pg_catalog.pg_stat_replication AS r;
