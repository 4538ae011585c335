-- +goose NO TRANSACTION
-- +goose Up
-- The operator's list (leasing.Postgres.List, leasectl list, the console)
-- pages through a queue status by status in (created_at, message_id)
-- order: a page of one status after a cursor is one descent and the page's
-- entries, at any table size. In-flight rows are left out: their status
-- already has that order (*_inflight_idx), and so claims and renewals,
-- whose new row versions are in flight, add no entry here. Every insert
-- adds one, and so does every write that leaves a row out of flight
-- (complete, fail, release, dead-letter, requeue). The cost is measured in
-- docs/notes/2026-12-03-console-list.md.
CREATE INDEX CONCURRENTLY IF NOT EXISTS inbox_messages_list_idx
    ON inbox_messages (status, created_at, message_id)
    WHERE status <> 'processing';
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_list_idx
    ON outbox_messages (status, created_at, message_id)
    WHERE status <> 'publishing';

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS outbox_messages_list_idx;
DROP INDEX CONCURRENTLY IF EXISTS inbox_messages_list_idx;
