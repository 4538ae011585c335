-- +goose NO TRANSACTION
-- +goose Up
-- The operator's list (leasing.Postgres.List, leasectl list, the console)
-- pages through a queue in (status, created_at, message_id) order: a
-- status filter is a range of this index, and a page after a cursor is one
-- descent and the page's entries, at any table size. No other index orders
-- every row: the claim indexes hold only claimable or leased rows, the
-- finish-time indexes one terminal status each, keyed by finish time.
-- Every insert adds one entry, and so does every write that changes the
-- status (claim, complete, fail, dead-letter, requeue); none of those is a
-- HOT update already (they change indexed columns), so renewals, which do
-- not change the status, add one too. The producers' cost is measured in
-- docs/notes/2026-12-03-console-list.md.
CREATE INDEX CONCURRENTLY IF NOT EXISTS inbox_messages_list_idx
    ON inbox_messages (status, created_at, message_id);
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_list_idx
    ON outbox_messages (status, created_at, message_id);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS outbox_messages_list_idx;
DROP INDEX CONCURRENTLY IF EXISTS inbox_messages_list_idx;
