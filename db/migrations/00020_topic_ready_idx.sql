-- +goose NO TRANSACTION
-- +goose Up
-- A claim scoped to topics (ClaimRequest.Topics; message types on the
-- inbox) reads each topic's ready rows here, in (created_at, message_id)
-- order after the topic, with the due check on visible_after an index
-- condition: the rows of other topics ahead of them in FIFO order cost
-- nothing. A claim that leaves topics out (ExceptTopics, or paused topics,
-- migration 00015) finds the topics present by one descent per topic. Like
-- the ready indexes of 00002, only pending and failed rows are in it.
CREATE INDEX CONCURRENTLY IF NOT EXISTS inbox_messages_topic_ready_idx
    ON inbox_messages (message_type, created_at, message_id, visible_after)
    WHERE status IN ('pending', 'failed');
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_topic_ready_idx
    ON outbox_messages (topic, created_at, message_id, visible_after)
    WHERE status IN ('pending', 'failed');

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS outbox_messages_topic_ready_idx;
DROP INDEX CONCURRENTLY IF EXISTS inbox_messages_topic_ready_idx;
