-- InboxClaim leases up to batch_size due inbox messages to lease_owner for
-- lease_for. Due are pending and failed rows whose visible_after has passed,
-- and processing rows whose lease has expired. Claimed rows become processing
-- with lease_expires_at = now + lease_for, lease_generation + 1 and
-- attempt_count + 1. InboxClaimTenant claims one tenant's rows.
-- Rows locked by concurrent claims are skipped. Returns the claimed rows in
-- FIFO order, (created_at, message_id).
-- name: InboxClaim :many
WITH ready AS (
    -- Index order over inbox_messages_ready_idx; visible_after is an index condition.
    SELECT message_id, created_at
    FROM inbox_messages
    WHERE status IN ('pending', 'failed')
      AND visible_after <= coalesce(sqlc.narg('now')::timestamptz, statement_timestamp())
    ORDER BY created_at, message_id
    LIMIT @batch_size::integer
    FOR UPDATE SKIP LOCKED
), expired AS (
    -- Index order over inbox_messages_inflight_idx; lease_expires_at is an index condition.
    SELECT message_id, created_at
    FROM inbox_messages
    WHERE status = 'processing'
      AND lease_expires_at <= coalesce(sqlc.narg('now')::timestamptz, statement_timestamp())
      -- Checked once, through inbox_messages_expiry_idx: while no lease has expired
      -- the branch reads nothing. A scalar subquery in expiry order rather
      -- than EXISTS, which drops ORDER BY and LIMIT: a generic plan guesses
      -- a third of the table matches and would stop a Seq Scan at the first.
      AND (SELECT l.lease_expires_at
           FROM inbox_messages AS l
           WHERE l.lease_expires_at <= coalesce(sqlc.narg('now')::timestamptz, statement_timestamp())
             AND l.lease_owner IS NOT NULL
           ORDER BY l.lease_expires_at
           LIMIT 1) IS NOT NULL
    ORDER BY created_at, message_id
    LIMIT @batch_size::integer
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT due.message_id
    FROM (SELECT * FROM ready UNION ALL SELECT * FROM expired) AS due
    ORDER BY due.created_at, due.message_id
    LIMIT @batch_size::integer
), claimed AS (
    UPDATE inbox_messages AS m
    SET status            = 'processing',
        lease_owner       = @lease_owner::text,
        lease_expires_at  = coalesce(sqlc.narg('now')::timestamptz, statement_timestamp()) + @lease_for::interval,
        lease_generation  = m.lease_generation + 1,
        attempt_count     = m.attempt_count + 1,
        last_attempted_at = coalesce(sqlc.narg('now')::timestamptz, statement_timestamp())
    FROM picked
    WHERE m.message_id = picked.message_id
    RETURNING m.*
)
SELECT message_id, message_type, payload, headers, tenant_id,
       idempotency_key, ''::text AS topic,
       created_at, visible_after, lease_owner::text AS lease_owner,
       lease_expires_at::timestamptz AS lease_expires_at,
       lease_generation, attempt_count, last_error
FROM claimed
ORDER BY created_at, message_id;

-- InboxClaimTenant is InboxClaim restricted to the rows of tenant_id, read
-- through the tenant's own claim indexes.
-- name: InboxClaimTenant :many
WITH ready AS (
    -- Index order over inbox_messages_tenant_ready_idx; visible_after is an index condition.
    SELECT message_id, created_at
    FROM inbox_messages
    WHERE status IN ('pending', 'failed')
      AND visible_after <= coalesce(sqlc.narg('now')::timestamptz, statement_timestamp())
      AND tenant_id = @tenant_id::text
    ORDER BY created_at, message_id
    LIMIT @batch_size::integer
    FOR UPDATE SKIP LOCKED
), expired AS (
    -- Index order over inbox_messages_tenant_inflight_idx; lease_expires_at is an index condition.
    SELECT message_id, created_at
    FROM inbox_messages
    WHERE status = 'processing'
      AND lease_expires_at <= coalesce(sqlc.narg('now')::timestamptz, statement_timestamp())
      -- Checked once, through inbox_messages_expiry_idx: while no lease has expired
      -- the branch reads nothing. A scalar subquery in expiry order rather
      -- than EXISTS, which drops ORDER BY and LIMIT: a generic plan guesses
      -- a third of the table matches and would stop a Seq Scan at the first.
      AND (SELECT l.lease_expires_at
           FROM inbox_messages AS l
           WHERE l.lease_expires_at <= coalesce(sqlc.narg('now')::timestamptz, statement_timestamp())
             AND l.lease_owner IS NOT NULL
           ORDER BY l.lease_expires_at
           LIMIT 1) IS NOT NULL
      AND tenant_id = @tenant_id::text
    ORDER BY created_at, message_id
    LIMIT @batch_size::integer
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT due.message_id
    FROM (SELECT * FROM ready UNION ALL SELECT * FROM expired) AS due
    ORDER BY due.created_at, due.message_id
    LIMIT @batch_size::integer
), claimed AS (
    UPDATE inbox_messages AS m
    SET status            = 'processing',
        lease_owner       = @lease_owner::text,
        lease_expires_at  = coalesce(sqlc.narg('now')::timestamptz, statement_timestamp()) + @lease_for::interval,
        lease_generation  = m.lease_generation + 1,
        attempt_count     = m.attempt_count + 1,
        last_attempted_at = coalesce(sqlc.narg('now')::timestamptz, statement_timestamp())
    FROM picked
    WHERE m.message_id = picked.message_id
    RETURNING m.*
)
SELECT message_id, message_type, payload, headers, tenant_id,
       idempotency_key, ''::text AS topic,
       created_at, visible_after, lease_owner::text AS lease_owner,
       lease_expires_at::timestamptz AS lease_expires_at,
       lease_generation, attempt_count, last_error
FROM claimed
ORDER BY created_at, message_id;

-- InboxCountByStatus returns the number of inbox rows per status, ordered by
-- status. Statuses without rows are absent.
-- name: InboxCountByStatus :many
SELECT status, count(*)::bigint AS messages
FROM inbox_messages
GROUP BY status
ORDER BY status;

-- InboxComplete writes completed (completed_at = now) for each
-- (message_id, lease_generation) still leased to lease_owner, and returns one
-- outcome per input row: applied; already_applied when this lease had already
-- completed it; terminal when it is completed or dead-lettered under another
-- lease; lost when the lease moved on; not_found.
-- name: InboxComplete :many
WITH input AS (
    SELECT unnest(@message_ids::uuid[]) AS message_id,
           unnest(@lease_generations::bigint[]) AS lease_generation
), locked AS (
    -- Lock in key order so that concurrent batches never deadlock; the locked
    -- read sees the latest committed version, so a retried write is classified
    -- against what the first attempt left. The fence is checked on these
    -- locked values (l), which no one else can change until this
    -- transaction ends, and never on m: a condition on m's status lets the planner
    -- read m through inbox_messages_inflight_idx, whose statistics may call it
    -- empty while thousands of rows are in flight (the table was analyzed
    -- when quiet), at O(rows in flight) per batch. With the fence on l, m
    -- is found through the primary key. l carries the input's generation
    -- so that the UPDATE does not join input again: the planner takes an
    -- array parameter for 10 elements and would nest that join, at
    -- O(batch²).
    SELECT m.message_id, m.status, m.lease_owner, m.lease_generation, m.outcome_generation, m.outcome,
           i.lease_generation AS input_generation
    FROM inbox_messages AS m
    JOIN input AS i ON i.message_id = m.message_id
    ORDER BY m.message_id
    FOR UPDATE OF m
), applied AS (
    UPDATE inbox_messages AS m
    SET status           = 'completed',
        completed_at     = coalesce(sqlc.narg('now')::timestamptz, statement_timestamp()),
        lease_expires_at = NULL
    FROM locked AS l
    WHERE m.message_id = l.message_id
      AND l.status = 'processing'
      AND l.lease_owner = @lease_owner::text
      AND l.lease_generation = l.input_generation
    RETURNING m.message_id
)
SELECT i.message_id::uuid AS message_id,
       (CASE
           WHEN a.message_id IS NOT NULL THEN 'applied'
           WHEN l.message_id IS NULL THEN 'not_found'
           WHEN l.status = 'completed' AND l.lease_owner = @lease_owner::text
                AND l.lease_generation = i.lease_generation THEN 'already_applied'
           WHEN l.status IN ('completed', 'dead_lettered') THEN 'terminal'
           ELSE 'lost'
       END)::text AS outcome
FROM input AS i
LEFT JOIN locked AS l ON l.message_id = i.message_id
LEFT JOIN applied AS a ON a.message_id = i.message_id;

-- InboxDeadLetter writes dead_lettered (dead_lettered_at = now, last_error)
-- for each (message_id, lease_generation, last_error) still leased to
-- lease_owner. Outcomes as for InboxComplete; already_applied when this lease
-- had already dead-lettered it (outcome_generation and outcome record that).
-- name: InboxDeadLetter :many
WITH input AS (
    SELECT unnest(@message_ids::uuid[]) AS message_id,
           unnest(@lease_generations::bigint[]) AS lease_generation,
           unnest(@last_errors::text[]) AS last_error
), locked AS (
    -- As in InboxComplete: locked in key order, and the fence reads these values.
    SELECT m.message_id, m.status, m.lease_owner, m.lease_generation, m.outcome_generation, m.outcome,
           i.lease_generation AS input_generation, i.last_error
    FROM inbox_messages AS m
    JOIN input AS i ON i.message_id = m.message_id
    ORDER BY m.message_id
    FOR UPDATE OF m
), applied AS (
    UPDATE inbox_messages AS m
    SET status           = 'dead_lettered',
        dead_lettered_at = coalesce(sqlc.narg('now')::timestamptz, statement_timestamp()),
        last_error       = l.last_error,
        lease_expires_at = NULL,
        outcome_generation = m.lease_generation,
        outcome          = 'dead_lettered'
    FROM locked AS l
    WHERE m.message_id = l.message_id
      AND l.status = 'processing'
      AND l.lease_owner = @lease_owner::text
      AND l.lease_generation = l.input_generation
    RETURNING m.message_id
)
SELECT i.message_id::uuid AS message_id,
       (CASE
           WHEN a.message_id IS NOT NULL THEN 'applied'
           WHEN l.message_id IS NULL THEN 'not_found'
           WHEN l.outcome_generation = i.lease_generation AND l.outcome = 'dead_lettered' THEN 'already_applied'
           WHEN l.status IN ('completed', 'dead_lettered') THEN 'terminal'
           ELSE 'lost'
       END)::text AS outcome
FROM input AS i
LEFT JOIN locked AS l ON l.message_id = i.message_id
LEFT JOIN applied AS a ON a.message_id = i.message_id;

-- InboxEnqueue inserts one inbox row per array element, in array order, due
-- after created_at + delays[i]. Empty strings in tenant_ids and
-- idempotency_keys mean NULL. A row whose message_id, or whose
-- (tenant_id, idempotency_key), is already present is skipped: it was
-- accepted before. Returns the message_id of each inserted row.
-- name: InboxEnqueue :many
INSERT INTO inbox_messages (
    message_id, message_type, payload, headers, tenant_id, idempotency_key,
    created_at, visible_after
)
SELECT i.message_id, i.message_type, i.payload, i.headers::jsonb,
       nullif(i.tenant_id, ''), nullif(i.idempotency_key, ''),
       i.created_at, i.created_at + i.delay
FROM (
    SELECT u.*, coalesce(sqlc.narg('now')::timestamptz, clock_timestamp()) AS created_at
    FROM (
        SELECT unnest(@message_ids::uuid[]) AS message_id,
               unnest(@message_types::text[]) AS message_type,
               unnest(@payloads::bytea[]) AS payload,
               unnest(@headers::text[]) AS headers,
               unnest(@tenant_ids::text[]) AS tenant_id,
               unnest(@idempotency_keys::text[]) AS idempotency_key,
               unnest(@delays::interval[]) AS delay
    ) AS u
) AS i
ON CONFLICT DO NOTHING
RETURNING message_id;

-- InboxEnqueueCopy bulk-loads inbox rows with COPY; they are due at once.
-- Unlike InboxEnqueue, a duplicate message_id or idempotency key fails the
-- whole copy.
-- name: InboxEnqueueCopy :copyfrom
INSERT INTO inbox_messages (message_id, message_type, payload, headers, tenant_id, idempotency_key)
VALUES ($1, $2, $3, $4, $5, $6);

-- InboxFail writes failed for each (message_id, lease_generation, retry_delay,
-- last_error) still leased to lease_owner: the row is due again at
-- now + retry_delay. Outcomes as for InboxComplete; already_applied when this
-- lease had already failed it.
-- name: InboxFail :many
WITH input AS (
    SELECT unnest(@message_ids::uuid[]) AS message_id,
           unnest(@lease_generations::bigint[]) AS lease_generation,
           unnest(@retry_delays::interval[]) AS retry_delay,
           unnest(@last_errors::text[]) AS last_error
), locked AS (
    -- As in InboxComplete: locked in key order, and the fence reads these values.
    SELECT m.message_id, m.status, m.lease_owner, m.lease_generation, m.outcome_generation, m.outcome,
           i.lease_generation AS input_generation, i.retry_delay, i.last_error
    FROM inbox_messages AS m
    JOIN input AS i ON i.message_id = m.message_id
    ORDER BY m.message_id
    FOR UPDATE OF m
), applied AS (
    UPDATE inbox_messages AS m
    SET status           = 'failed',
        visible_after    = coalesce(sqlc.narg('now')::timestamptz, statement_timestamp()) + l.retry_delay,
        last_error       = l.last_error,
        lease_expires_at = NULL,
        outcome_generation = m.lease_generation,
        outcome          = 'failed'
    FROM locked AS l
    WHERE m.message_id = l.message_id
      AND l.status = 'processing'
      AND l.lease_owner = @lease_owner::text
      AND l.lease_generation = l.input_generation
    RETURNING m.message_id
)
SELECT i.message_id::uuid AS message_id,
       (CASE
           WHEN a.message_id IS NOT NULL THEN 'applied'
           WHEN l.message_id IS NULL THEN 'not_found'
           WHEN l.outcome_generation = i.lease_generation AND l.outcome = 'failed' THEN 'already_applied'
           WHEN l.status IN ('completed', 'dead_lettered') THEN 'terminal'
           ELSE 'lost'
       END)::text AS outcome
FROM input AS i
LEFT JOIN locked AS l ON l.message_id = i.message_id
LEFT JOIN applied AS a ON a.message_id = i.message_id;

-- InboxGet returns one inbox row by message_id, or pgx.ErrNoRows;
-- completed_at is returned as finished_at.
-- name: InboxGet :one
SELECT message_id, message_type, payload, headers, tenant_id,
       idempotency_key, ''::text AS topic,
       created_at, visible_after, status, lease_owner, lease_expires_at,
       lease_generation, outcome_generation, outcome, attempt_count, last_attempted_at, last_error,
       completed_at AS finished_at, dead_lettered_at
FROM inbox_messages
WHERE message_id = @message_id::uuid;

-- InboxLeaseHealth returns, at the database's now, the number of processing
-- rows whose lease has expired and not yet been reclaimed, and the age of the
-- oldest due row (the claim head; 0 when nothing is due).
-- name: InboxLeaseHealth :one
SELECT
    -- Leased rows are those with an expiry and an owner (the lease CHECK), so
    -- the count reads inbox_messages_expiry_idx: expired entries only.
    (SELECT count(*)
     FROM inbox_messages
     WHERE lease_expires_at <= coalesce(sqlc.narg('now')::timestamptz, statement_timestamp())
       AND lease_owner IS NOT NULL
    )::bigint AS expired_leases,
    coalesce(coalesce(sqlc.narg('now')::timestamptz, statement_timestamp()) - least(
        (SELECT min(created_at)
         FROM inbox_messages
         WHERE status IN ('pending', 'failed')
           AND visible_after <= coalesce(sqlc.narg('now')::timestamptz, statement_timestamp())),
        (SELECT min(created_at)
         FROM inbox_messages
         WHERE status = 'processing'
           AND lease_expires_at <= coalesce(sqlc.narg('now')::timestamptz, statement_timestamp()))
    ), '0'::interval)::interval AS oldest_due_age;

-- InboxList returns up to max_rows inbox rows ordered by (created_at,
-- message_id), starting after after_created_at/after_message_id (keyset
-- pagination; pass the zero time and zero uuid for the first page).
-- name: InboxList :many
SELECT message_id, message_type, payload, headers, tenant_id,
       idempotency_key, ''::text AS topic,
       created_at, visible_after, status, lease_owner, lease_expires_at,
       lease_generation, outcome_generation, outcome, attempt_count, last_attempted_at, last_error,
       completed_at AS finished_at, dead_lettered_at
FROM inbox_messages
WHERE (created_at, message_id) > (@after_created_at::timestamptz, @after_message_id::uuid)
ORDER BY created_at, message_id
LIMIT @max_rows::integer;

-- InboxPurge deletes up to batch_size terminal inbox rows whose completed_at
-- (or dead_lettered_at, when include_dead_lettered) is older than now minus
-- older_than. Active rows are never touched. Returns the number deleted; call
-- it until it returns fewer than batch_size.
-- name: InboxPurge :execrows
DELETE FROM inbox_messages
WHERE message_id IN (
    SELECT message_id
    FROM inbox_messages
    WHERE (status = 'completed'
           AND completed_at < coalesce(sqlc.narg('now')::timestamptz, statement_timestamp()) - @older_than::interval)
       OR (@include_dead_lettered::boolean AND status = 'dead_lettered'
           AND dead_lettered_at < coalesce(sqlc.narg('now')::timestamptz, statement_timestamp()) - @older_than::interval)
    LIMIT @batch_size::integer
    FOR UPDATE SKIP LOCKED
);

-- InboxRelease gives leases back early for each (message_id, lease_generation)
-- still leased to lease_owner: the row becomes pending and due at once, its
-- lease_owner and lease_expires_at are cleared and the attempt it counted is
-- returned (attempt_count - 1). lease_generation stays, so the released lease
-- is fenced. Outcomes as for InboxComplete; already_applied when this lease
-- had already released it (outcome_generation and outcome record that).
-- name: InboxRelease :many
WITH input AS (
    SELECT unnest(@message_ids::uuid[]) AS message_id,
           unnest(@lease_generations::bigint[]) AS lease_generation
), locked AS (
    -- As in InboxComplete: locked in key order, and the fence reads these values.
    SELECT m.message_id, m.status, m.lease_owner, m.lease_generation, m.outcome_generation, m.outcome,
           i.lease_generation AS input_generation
    FROM inbox_messages AS m
    JOIN input AS i ON i.message_id = m.message_id
    ORDER BY m.message_id
    FOR UPDATE OF m
), applied AS (
    UPDATE inbox_messages AS m
    SET status           = 'pending',
        visible_after    = coalesce(sqlc.narg('now')::timestamptz, statement_timestamp()),
        lease_owner      = NULL,
        lease_expires_at = NULL,
        attempt_count    = greatest(m.attempt_count - 1, 0),
        outcome_generation = m.lease_generation,
        outcome          = 'released'
    FROM locked AS l
    WHERE m.message_id = l.message_id
      AND l.status = 'processing'
      AND l.lease_owner = @lease_owner::text
      AND l.lease_generation = l.input_generation
    RETURNING m.message_id
)
SELECT i.message_id::uuid AS message_id,
       (CASE
           WHEN a.message_id IS NOT NULL THEN 'applied'
           WHEN l.message_id IS NULL THEN 'not_found'
           WHEN l.outcome_generation = i.lease_generation AND l.outcome = 'released' THEN 'already_applied'
           WHEN l.status IN ('completed', 'dead_lettered') THEN 'terminal'
           ELSE 'lost'
       END)::text AS outcome
FROM input AS i
LEFT JOIN locked AS l ON l.message_id = i.message_id
LEFT JOIN applied AS a ON a.message_id = i.message_id;

-- InboxReleaseOrphans releases every processing inbox row leased to
-- lease_owner whose message_id is not in held_message_ids: leases a claim
-- took for an owner that never learned of them, because the claim's reply
-- was lost after it committed. Like InboxRelease, each row becomes pending and
-- due at once, its lease owner and expiry are cleared and its attempt is
-- returned. Rows locked by others are skipped. Returns the released
-- message_ids in message_id order.
-- name: InboxReleaseOrphans :many
WITH orphans AS (
    SELECT message_id
    FROM inbox_messages
    WHERE status = 'processing'
      AND lease_owner = @lease_owner::text
      AND NOT (message_id = ANY (@held_message_ids::uuid[]))
    ORDER BY message_id
    FOR UPDATE SKIP LOCKED
), released AS (
    UPDATE inbox_messages AS m
    SET status           = 'pending',
        visible_after    = coalesce(sqlc.narg('now')::timestamptz, statement_timestamp()),
        lease_owner      = NULL,
        lease_expires_at = NULL,
        attempt_count    = greatest(m.attempt_count - 1, 0),
        outcome_generation = m.lease_generation,
        outcome          = 'released'
    FROM orphans
    WHERE m.message_id = orphans.message_id
    RETURNING m.message_id
)
SELECT message_id FROM released ORDER BY message_id;

-- InboxRenew extends lease_expires_at to now + lease_for for each
-- (message_id, lease_generation) still leased to lease_owner whose lease has
-- not expired. Returns the renewed rows with their new expiry, in
-- message_id order; inputs absent from the result have lost their lease.
-- name: InboxRenew :many
WITH input AS (
    SELECT unnest(@message_ids::uuid[]) AS message_id,
           unnest(@lease_generations::bigint[]) AS lease_generation
), locked AS (
    -- The rows of this owner under the input's generation, locked in key
    -- order: those still leased, and those its own outcome write has just
    -- finished, which the fence below refuses. No condition on m's status
    -- here: it would let the planner read m through inbox_messages_inflight_idx
    -- (see InboxComplete).
    SELECT m.message_id, m.status, m.lease_owner, m.lease_generation, m.lease_expires_at,
           i.lease_generation AS input_generation
    FROM inbox_messages AS m
    JOIN input AS i ON i.message_id = m.message_id
    WHERE m.lease_owner = @lease_owner::text
      AND m.lease_generation = i.lease_generation
    ORDER BY m.message_id
    FOR UPDATE OF m
), renewed AS (
    UPDATE inbox_messages AS m
    SET lease_expires_at = coalesce(sqlc.narg('now')::timestamptz, statement_timestamp()) + @lease_for::interval
    FROM locked AS l
    WHERE m.message_id = l.message_id
      AND l.status = 'processing'
      AND l.lease_owner = @lease_owner::text
      AND l.lease_generation = l.input_generation
      AND l.lease_expires_at > coalesce(sqlc.narg('now')::timestamptz, statement_timestamp())
    RETURNING m.message_id, m.lease_expires_at
)
SELECT message_id, lease_expires_at::timestamptz AS lease_expires_at
FROM renewed
ORDER BY message_id;

-- InboxRequeue moves dead-lettered inbox rows back to pending, due at once,
-- with attempt_count 0 and lease_owner, lease_expires_at, last_error and
-- dead_lettered_at cleared: every dead-lettered row when requeue_all, else
-- those in message_ids. Rows in any other status are left alone. Returns the
-- requeued message_ids in message_id order.
-- name: InboxRequeue :many
WITH requeued AS (
    UPDATE inbox_messages
    SET status           = 'pending',
        visible_after    = coalesce(sqlc.narg('now')::timestamptz, statement_timestamp()),
        attempt_count    = 0,
        lease_owner      = NULL,
        lease_expires_at = NULL,
        last_error       = NULL,
        dead_lettered_at = NULL
    WHERE status = 'dead_lettered'
      AND (@requeue_all::boolean OR message_id = ANY (@message_ids::uuid[]))
    RETURNING message_id
)
SELECT message_id FROM requeued ORDER BY message_id;
