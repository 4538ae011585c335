-- +goose NO TRANSACTION
-- +goose Up
-- The access path to finished outbox rows, one index per terminal status, each
-- keyed by that status's finish time. Purge reads each in finish-time order
-- up to its batch and stops at the first row newer than the cutoff, so a
-- retention run costs the rows it deletes, however many finished rows the
-- table holds (plus the entries of rows deleted since the last VACUUM);
-- RequeueAll reads dead letters, oldest first, through the second.
-- Two indexes, not one over both finish times: a purge that keeps dead
-- letters (the default) would otherwise pass every old dead letter on each
-- call, and requeue would pass every finished row. The published and
-- dead-letter writes already change indexed columns (status,
-- lease_expires_at), so they were not HOT updates before: each now adds
-- one index entry, and claims and renews are unchanged.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_published_idx
    ON outbox_messages (published_at)
    WHERE status = 'published';
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_dead_lettered_idx
    ON outbox_messages (dead_lettered_at)
    WHERE status = 'dead_lettered';

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS outbox_messages_dead_lettered_idx;
DROP INDEX CONCURRENTLY IF EXISTS outbox_messages_published_idx;
