-- +goose Up
-- Ordering keys (NewMessage.OrderingKey): messages of one key, per tenant,
-- are handled one at a time in enqueue order.
--
-- Only a key's head (its first unfinished message) is ever pending, failed
-- or in flight; the messages behind it are 'waiting', a status that no
-- claim index covers (their predicates name pending and failed, or the
-- in-flight status). The claim therefore needs no key condition at all and
-- stays O(batch): messages behind a busy key are not in the index it reads.
-- Finishing a head promotes the next message of its key to pending in the
-- same transaction.
--
-- ordering_key: NULL for unordered messages (every row enqueued before this
-- migration). key_seq: the message's place in its key's line, given at
-- enqueue under the key row's lock (see *_ordering_keys below).
--
-- ADD COLUMN without a default and a widened CHECK added NOT VALID change
-- the catalog only: no table rewrite, no scan. The ACCESS EXCLUSIVE lock is
-- held for milliseconds but waits behind every open transaction on the
-- table; the lock_timeout makes the migration fail (run it again) instead
-- of stalling the queue. 00011 validates the CHECKs without that lock.
SET LOCAL lock_timeout = '10s';
ALTER TABLE inbox_messages ADD COLUMN ordering_key text, ADD COLUMN key_seq bigint;
ALTER TABLE outbox_messages ADD COLUMN ordering_key text, ADD COLUMN key_seq bigint;
ALTER TABLE inbox_messages DROP CONSTRAINT inbox_messages_status_check;
ALTER TABLE inbox_messages ADD CONSTRAINT inbox_messages_status_check
    CHECK (status IN ('pending', 'processing', 'completed', 'failed', 'dead_lettered', 'waiting')) NOT VALID;
ALTER TABLE outbox_messages DROP CONSTRAINT outbox_messages_status_check;
ALTER TABLE outbox_messages ADD CONSTRAINT outbox_messages_status_check
    CHECK (status IN ('pending', 'publishing', 'published', 'failed', 'dead_lettered', 'waiting')) NOT VALID;

-- One row per key that has unfinished messages (or, in strict mode, a
-- dead-lettered head): the serialisation point of the key. tenant_id is ''
-- for messages without a tenant. last_seq is the last key_seq given;
-- head_id the message that holds the key (NULL only inside the transaction
-- that finishes a head, between the write and the promotion); head_since
-- when it became the head (database clock). An enqueue of a keyed message
-- upserts the row (INSERT ... ON CONFLICT DO UPDATE waits for and then sees
-- the latest committed version), so enqueues of one key are ordered by the
-- row's lock: commit order. The row is deleted when its last message
-- finishes, so the table holds the keys in use, not every key ever seen.
-- Its only index is the primary key: statements reach a key row from a
-- message's (tenant_id, ordering_key), so that moving head_id on, once per
-- message of the key, is a HOT update.
CREATE TABLE inbox_ordering_keys (
    tenant_id    text        NOT NULL,
    ordering_key text        NOT NULL,
    last_seq     bigint      NOT NULL,
    head_id      uuid,
    head_since   timestamptz,
    PRIMARY KEY (tenant_id, ordering_key)
);
CREATE TABLE outbox_ordering_keys (
    tenant_id    text        NOT NULL,
    ordering_key text        NOT NULL,
    last_seq     bigint      NOT NULL,
    head_id      uuid,
    head_since   timestamptz,
    PRIMARY KEY (tenant_id, ordering_key)
);

-- Per-queue settings decided in the database, so that every process
-- agrees: strict_ordering keeps a dead-lettered head's key blocked until
-- the head is requeued or purged (leasectl ordering --strict).
CREATE TABLE leasestore_queue_settings (
    queue           text    PRIMARY KEY CHECK (queue IN ('inbox', 'outbox')),
    strict_ordering boolean NOT NULL DEFAULT false
);
INSERT INTO leasestore_queue_settings (queue) VALUES ('inbox'), ('outbox');

-- Raised by an inbox enqueue whose duplicate carries another ordering key
-- than the stored message (SQLSTATE LS001, the message id as DETAIL): the
-- enqueue fails and inserts nothing.
-- +goose StatementBegin
CREATE FUNCTION leasestore_ordering_key_conflict(message_id text) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'leasestore: duplicate message % carries another ordering key', message_id
        USING ERRCODE = 'LS001', DETAIL = message_id;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
DO $grant$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'leasestore_processor') THEN
        GRANT UPDATE (key_seq) ON inbox_messages, outbox_messages TO leasestore_processor;
        GRANT SELECT, INSERT, UPDATE, DELETE ON inbox_ordering_keys, outbox_ordering_keys TO leasestore_processor;
        GRANT SELECT ON leasestore_queue_settings TO leasestore_processor;
    END IF;
END
$grant$;
-- +goose StatementEnd

COMMENT ON COLUMN inbox_messages.ordering_key IS 'NULL: unordered. Messages of one (tenant_id, ordering_key) are handled one at a time in key_seq order.';
COMMENT ON COLUMN outbox_messages.ordering_key IS 'NULL: unordered. Messages of one (tenant_id, ordering_key) are handled one at a time in key_seq order.';
COMMENT ON COLUMN inbox_messages.key_seq IS 'Place in the key''s line, given at enqueue (or requeue) under the key row''s lock.';
COMMENT ON COLUMN outbox_messages.key_seq IS 'Place in the key''s line, given at enqueue (or requeue) under the key row''s lock.';

-- +goose Down
SET LOCAL lock_timeout = '10s';
DROP FUNCTION leasestore_ordering_key_conflict(text);
DROP TABLE leasestore_queue_settings;
DROP TABLE outbox_ordering_keys;
DROP TABLE inbox_ordering_keys;
ALTER TABLE outbox_messages DROP CONSTRAINT outbox_messages_status_check;
ALTER TABLE outbox_messages ADD CONSTRAINT outbox_messages_status_check
    CHECK (status IN ('pending', 'publishing', 'published', 'failed', 'dead_lettered')) NOT VALID;
ALTER TABLE inbox_messages DROP CONSTRAINT inbox_messages_status_check;
ALTER TABLE inbox_messages ADD CONSTRAINT inbox_messages_status_check
    CHECK (status IN ('pending', 'processing', 'completed', 'failed', 'dead_lettered')) NOT VALID;
ALTER TABLE outbox_messages DROP COLUMN key_seq, DROP COLUMN ordering_key;
ALTER TABLE inbox_messages DROP COLUMN key_seq, DROP COLUMN ordering_key;
