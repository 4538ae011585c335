-- BeginReadCommitted opens the transaction of one store call, at READ
-- COMMITTED whatever default_transaction_isolation the database, the role
-- or the session sets: the store's statements rely on it (a claim or a
-- fenced write that waited for a row lock re-checks the row's new version
-- instead of failing with a serialization error, SQLSTATE 40001). The
-- store sends it first in the call's batch and CommitCall last, in the
-- same round trip. An explicit block, not SET TRANSACTION in the batch's
-- implicit transaction: PostgreSQL does not count that one as a
-- transaction block, and logs a WARNING for every call that sets it.
-- name: BeginReadCommitted :exec
BEGIN ISOLATION LEVEL READ COMMITTED;

-- CommitCall commits the transaction BeginReadCommitted opened. When a
-- statement before it fails, the server skips the rest of the batch, this
-- included, and leaves the transaction aborted: RollbackCall ends it.
-- name: CommitCall :exec
COMMIT;

-- RollbackCall ends a call's transaction that a failed statement left
-- aborted, so that its connection goes back to the pool idle.
-- name: RollbackCall :exec
ROLLBACK;

-- UseHotPathSettings makes the statements that follow in the current
-- transaction reuse the generic plan of their prepared statement instead of
-- planning again for every call's parameter values, never compile with JIT,
-- and wait at most lock_timeout (text with a unit, e.g. '5000ms') for one
-- lock. The store sends it after BeginReadCommitted with its claim and
-- fenced-write statements, whose generic plans are the same index plans as
-- their custom ones (leasectl doctor explains both). A generic claim's
-- estimated cost counts every branch it may take (topics, tenants), above
-- the default jit_above_cost (100,000) from a few hundred thousand rows
-- on, and JIT then compiles about 120 functions on every call: some 40 ms
-- for a claim that runs in 1-3 ms. is_local = true: the settings end with
-- the transaction.
-- name: UseHotPathSettings :exec
SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('jit', 'off', true),
       set_config('lock_timeout', @lock_timeout::text, true);

-- UseLockTimeout sets the current transaction's lock_timeout to
-- lock_timeout (text with a unit, e.g. '5000ms'): a statement that waits
-- longer than that for one lock (a table lock behind DDL, or a row lock)
-- fails with SQLSTATE 55P03 and changes nothing. The store sends it after
-- BeginReadCommitted with its operator statements, which keep the session's
-- plan_cache_mode. is_local = true: the setting ends with the transaction.
-- name: UseLockTimeout :exec
SELECT set_config('lock_timeout', @lock_timeout::text, true);

-- UseCustomPlansAndLockTimeout makes the statements that follow in the
-- current transaction be planned for each call's parameter values, and
-- sets the transaction's lock_timeout as UseLockTimeout does. The store
-- sends it with the operator's list (InboxList, OutboxList): its filters
-- are optional, and a generic plan, which cannot know which are set nor
-- the page size, may sort every row instead of reading the list index in
-- order. is_local = true: the settings end with the transaction.
-- name: UseCustomPlansAndLockTimeout :exec
SELECT set_config('plan_cache_mode', 'force_custom_plan', true),
       set_config('lock_timeout', @lock_timeout::text, true);
