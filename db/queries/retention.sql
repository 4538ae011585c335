-- RetentionTurn waits for the retention turn named by lock_name (hashed to
-- 64 bits by hashtextextended), a transaction-level advisory lock: the
-- purge statements after it in the same transaction run one runner at a
-- time per queue, and the lock ends with the transaction, so that it holds
-- behind a transaction-mode pooler too. The wait is bounded by the call's
-- lock_timeout.
-- name: RetentionTurn :exec
SELECT pg_advisory_xact_lock(hashtextextended(@lock_name::text, 0));
