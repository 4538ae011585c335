-- +goose Up
-- Status is text with a CHECK rather than an enum: the two queues have different
-- in-flight and success states, and text keeps one Go type for both and lets a
-- later migration widen the set inside a transaction.
CREATE TABLE inbox_messages (
    message_id        uuid        PRIMARY KEY,
    message_type      text        NOT NULL DEFAULT '',
    payload           bytea       NOT NULL,
    headers           jsonb       NOT NULL DEFAULT '{}',
    tenant_id         text,
    idempotency_key   text,
    created_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    visible_after     timestamptz NOT NULL DEFAULT clock_timestamp(),
    status            text        NOT NULL DEFAULT 'pending',
    lease_owner       text,
    lease_expires_at  timestamptz,
    lease_generation  bigint      NOT NULL DEFAULT 0,
    outcome_generation bigint     NOT NULL DEFAULT 0,
    outcome           text,
    attempt_count     integer     NOT NULL DEFAULT 0,
    last_attempted_at timestamptz,
    last_error        text,
    completed_at      timestamptz,
    dead_lettered_at  timestamptz,
    CONSTRAINT inbox_messages_status_check
        CHECK (status IN ('pending', 'processing', 'completed', 'failed', 'dead_lettered')),
    CONSTRAINT inbox_messages_lease_check
        CHECK ((status = 'processing') = (lease_expires_at IS NOT NULL)
               AND (status <> 'processing' OR lease_owner IS NOT NULL)),
    CONSTRAINT inbox_messages_completed_check
        CHECK ((status = 'completed') = (completed_at IS NOT NULL)),
    CONSTRAINT inbox_messages_dead_lettered_check
        CHECK ((status = 'dead_lettered') = (dead_lettered_at IS NOT NULL)),
    CONSTRAINT inbox_messages_counters_check
        CHECK (attempt_count >= 0 AND lease_generation >= 0 AND outcome_generation BETWEEN 0 AND lease_generation
               AND (outcome IS NULL OR outcome IN ('released', 'failed', 'dead_lettered')))
);

CREATE UNIQUE INDEX inbox_messages_idempotency_key_idx
    ON inbox_messages (tenant_id, idempotency_key) NULLS NOT DISTINCT
    WHERE idempotency_key IS NOT NULL;

COMMENT ON COLUMN inbox_messages.created_at IS 'Database clock (clock_timestamp) at insert; claims are FIFO by (created_at, message_id).';
COMMENT ON COLUMN inbox_messages.visible_after IS 'Not claimable before this database time. Defaults to the insert time: due at once.';
COMMENT ON COLUMN inbox_messages.lease_owner IS 'Owner of the current lease while processing; the last owner that wrote a terminal or failed state otherwise.';
COMMENT ON COLUMN inbox_messages.lease_expires_at IS 'Database time the current lease ends; set if and only if status is processing.';
COMMENT ON COLUMN inbox_messages.lease_generation IS 'Fencing token: +1 on every claim, never reset; every renew and outcome write must carry it.';
COMMENT ON COLUMN inbox_messages.outcome_generation IS 'The lease_generation whose holder wrote the latest release, fail or dead-letter (0: none); with outcome, lets a retried write tell already applied from lost after the row was claimed again.';
COMMENT ON COLUMN inbox_messages.outcome IS 'What the holder of outcome_generation wrote: released, failed or dead_lettered.';
COMMENT ON COLUMN inbox_messages.attempt_count IS 'Claims that counted as attempts: +1 per claim, -1 when a lease is released unstarted, 0 after requeue.';

CREATE TABLE outbox_messages (
    message_id        uuid        PRIMARY KEY,
    message_type      text        NOT NULL DEFAULT '',
    payload           bytea       NOT NULL,
    headers           jsonb       NOT NULL DEFAULT '{}',
    tenant_id         text,
    topic             text        NOT NULL DEFAULT '',
    created_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    visible_after     timestamptz NOT NULL DEFAULT clock_timestamp(),
    status            text        NOT NULL DEFAULT 'pending',
    lease_owner       text,
    lease_expires_at  timestamptz,
    lease_generation  bigint      NOT NULL DEFAULT 0,
    outcome_generation bigint     NOT NULL DEFAULT 0,
    outcome           text,
    attempt_count     integer     NOT NULL DEFAULT 0,
    last_attempted_at timestamptz,
    last_error        text,
    published_at      timestamptz,
    dead_lettered_at  timestamptz,
    CONSTRAINT outbox_messages_status_check
        CHECK (status IN ('pending', 'publishing', 'published', 'failed', 'dead_lettered')),
    CONSTRAINT outbox_messages_lease_check
        CHECK ((status = 'publishing') = (lease_expires_at IS NOT NULL)
               AND (status <> 'publishing' OR lease_owner IS NOT NULL)),
    CONSTRAINT outbox_messages_published_check
        CHECK ((status = 'published') = (published_at IS NOT NULL)),
    CONSTRAINT outbox_messages_dead_lettered_check
        CHECK ((status = 'dead_lettered') = (dead_lettered_at IS NOT NULL)),
    CONSTRAINT outbox_messages_counters_check
        CHECK (attempt_count >= 0 AND lease_generation >= 0 AND outcome_generation BETWEEN 0 AND lease_generation
               AND (outcome IS NULL OR outcome IN ('released', 'failed', 'dead_lettered')))
);

COMMENT ON COLUMN outbox_messages.created_at IS 'Database clock (clock_timestamp) at insert; claims are FIFO by (created_at, message_id).';
COMMENT ON COLUMN outbox_messages.visible_after IS 'Not claimable before this database time. Defaults to the insert time: due at once.';
COMMENT ON COLUMN outbox_messages.lease_owner IS 'Owner of the current lease while publishing; the last owner that wrote a terminal or failed state otherwise.';
COMMENT ON COLUMN outbox_messages.lease_expires_at IS 'Database time the current lease ends; set if and only if status is publishing.';
COMMENT ON COLUMN outbox_messages.lease_generation IS 'Fencing token: +1 on every claim, never reset; every renew and outcome write must carry it.';
COMMENT ON COLUMN outbox_messages.outcome_generation IS 'The lease_generation whose holder wrote the latest release, fail or dead-letter (0: none); with outcome, lets a retried write tell already applied from lost after the row was claimed again.';
COMMENT ON COLUMN outbox_messages.outcome IS 'What the holder of outcome_generation wrote: released, failed or dead_lettered.';
COMMENT ON COLUMN outbox_messages.attempt_count IS 'Claims that counted as attempts: +1 per claim, -1 when a lease is released unstarted, 0 after requeue.';

-- Claims and renews touch the same rows over and over; a lower fillfactor leaves
-- room for HOT updates, and autovacuum runs after a fixed number of dead rows
-- instead of 20% of the table, so dead index entries at the claim head stay few.
ALTER TABLE inbox_messages SET (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0.0,
    autovacuum_vacuum_insert_threshold = 20000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1
);
ALTER TABLE outbox_messages SET (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.0,
    autovacuum_vacuum_threshold = 5000,
    autovacuum_vacuum_insert_scale_factor = 0.0,
    autovacuum_vacuum_insert_threshold = 20000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1
);

-- +goose Down
DROP TABLE outbox_messages;
DROP TABLE inbox_messages;
