-- +goose NO TRANSACTION
-- +goose Up
-- The claim reads two branches, each in index order, and merges them by
-- (created_at, message_id):
--   ready:   pending/failed rows, scanned by (created_at, message_id); the due
--            check on visible_after is an index condition, so deferred rows
--            cost index entries only, never heap visits;
--   expired: in-flight rows, scanned the same way; the expiry check is an
--            index condition, so live leases cost index entries only.
-- Terminal rows are in neither index, so a table with millions of completed
-- rows claims as fast as an empty one. CONCURRENTLY keeps writers running
-- while a live table is migrated.
CREATE INDEX CONCURRENTLY IF NOT EXISTS inbox_messages_ready_idx
    ON inbox_messages (created_at, message_id, visible_after)
    WHERE status IN ('pending', 'failed');
CREATE INDEX CONCURRENTLY IF NOT EXISTS inbox_messages_inflight_idx
    ON inbox_messages (created_at, message_id, lease_expires_at)
    WHERE status = 'processing';
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_ready_idx
    ON outbox_messages (created_at, message_id, visible_after)
    WHERE status IN ('pending', 'failed');
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_inflight_idx
    ON outbox_messages (created_at, message_id, lease_expires_at)
    WHERE status = 'publishing';

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS outbox_messages_inflight_idx;
DROP INDEX CONCURRENTLY IF EXISTS outbox_messages_ready_idx;
DROP INDEX CONCURRENTLY IF EXISTS inbox_messages_inflight_idx;
DROP INDEX CONCURRENTLY IF EXISTS inbox_messages_ready_idx;
