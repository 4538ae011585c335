-- +goose NO TRANSACTION
-- +goose Up
-- The line behind each key of the inbox: waiting rows by (tenant, key,
-- key_seq). Finishing a head reads its key's first entry here to promote
-- it, one descent whatever the key's backlog. Only waiting rows are in it,
-- so unordered traffic and heads cost nothing here.
CREATE INDEX CONCURRENTLY IF NOT EXISTS inbox_messages_waiting_idx
    ON inbox_messages (coalesce(tenant_id, ''), ordering_key, key_seq)
    WHERE status = 'waiting';

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS inbox_messages_waiting_idx;
