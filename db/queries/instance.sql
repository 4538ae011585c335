-- InstanceLock takes the session-level advisory lock named by lock_name
-- (hashed to 64 bits by hashtextextended) without waiting, and reports
-- whether this session holds it. A processor instance holds its identity's
-- lock on a direct connection for as long as it runs: the server frees it
-- when the session ends, so a crashed instance's successor takes it at once
-- and a second live instance cannot. Behind a transaction-mode pooler a
-- session lock would stay on a shared server session: send it directly.
-- name: InstanceLock :one
SELECT pg_try_advisory_lock(hashtextextended(@lock_name::text, 0)) AS locked;

-- InstanceLockHolder returns the server process id of the session that
-- holds the advisory lock named by lock_name, or no row when none does.
-- name: InstanceLockHolder :many
SELECT l.pid
FROM pg_catalog.pg_locks AS l
WHERE l.locktype = 'advisory'
  AND l.granted
  AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
  AND l.objsubid = 1
  AND l.classid = ((hashtextextended(@lock_name::text, 0) >> 32) & 4294967295)::oid
  AND l.objid = (hashtextextended(@lock_name::text, 0) & 4294967295)::oid;

-- InstanceUnlock frees the session-level advisory lock named by lock_name
-- that this session holds, at once: closing the connection frees it too,
-- but only once the server process has ended, after the client returned,
-- so that a successor taking the identity right after the close could
-- find it still held.
-- name: InstanceUnlock :exec
SELECT pg_advisory_unlock(hashtextextended(@lock_name::text, 0));
