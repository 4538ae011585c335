-- +goose NO TRANSACTION
-- +goose Up
-- A claim for one tenant reads these instead of the untenanted claim indexes:
-- the tenant is the leading key, so other tenants' rows cost nothing. Rows
-- without a tenant are not in them, so queues without tenants pay no extra
-- index writes.
CREATE INDEX CONCURRENTLY IF NOT EXISTS inbox_messages_tenant_ready_idx
    ON inbox_messages (tenant_id, created_at, message_id, visible_after)
    WHERE status IN ('pending', 'failed') AND tenant_id IS NOT NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS inbox_messages_tenant_inflight_idx
    ON inbox_messages (tenant_id, created_at, message_id, lease_expires_at)
    WHERE status = 'processing' AND tenant_id IS NOT NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_tenant_ready_idx
    ON outbox_messages (tenant_id, created_at, message_id, visible_after)
    WHERE status IN ('pending', 'failed') AND tenant_id IS NOT NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_tenant_inflight_idx
    ON outbox_messages (tenant_id, created_at, message_id, lease_expires_at)
    WHERE status = 'publishing' AND tenant_id IS NOT NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS outbox_messages_tenant_inflight_idx;
DROP INDEX CONCURRENTLY IF EXISTS outbox_messages_tenant_ready_idx;
DROP INDEX CONCURRENTLY IF EXISTS inbox_messages_tenant_inflight_idx;
DROP INDEX CONCURRENTLY IF EXISTS inbox_messages_tenant_ready_idx;
