-- +goose Up
-- Pauses, decided in the database so that every processor agrees: a row
-- per paused (queue, topic); topic '' pauses the whole queue. A topic is
-- the outbox's topic or the inbox's message type, as ClaimRequest.Topics.
-- Every claim reads the queue's rows here (one index range, a few rows):
-- it claims nothing while the whole queue is paused and no message of a
-- paused topic; leases already held run to their end.
CREATE TABLE leasestore_paused (
    queue     text        NOT NULL CHECK (queue IN ('inbox', 'outbox')),
    topic     text        NOT NULL,
    paused_by text        NOT NULL,
    paused_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (queue, topic)
);
COMMENT ON COLUMN leasestore_paused.topic IS 'The paused topic (outbox) or message type (inbox); empty: the whole queue.';
COMMENT ON COLUMN leasestore_paused.paused_by IS 'Who paused it, as the caller named itself (leasectl: user@host).';

-- +goose StatementBegin
DO $grant$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'leasestore_processor') THEN
        GRANT SELECT ON leasestore_paused TO leasestore_processor;
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'leasestore_operator') THEN
        GRANT INSERT, DELETE ON leasestore_paused TO leasestore_operator;
    END IF;
END
$grant$;
-- +goose StatementEnd

-- +goose Down
DROP TABLE leasestore_paused;
