-- +goose Up
-- A row's lease generations start at the enqueueing transaction's id
-- instead of 0. Each claim or other change of a row's generation adds 1,
-- in a transaction of its own with an id of its own, and the purge that
-- frees a message id comes after them all: a row enqueued again under that
-- id starts above every generation the purged row reached, so that no
-- lease of the purged row passes the new row's fence, whoever holds it.
-- Before, both rows counted from 0, and an outcome of the purged row still
-- being written could apply to the new row once the same lease owner had
-- claimed it. Rows already in the tables keep their generations. A catalog
-- change only: no row is rewritten.
ALTER TABLE inbox_messages ALTER COLUMN lease_generation SET DEFAULT pg_current_xact_id()::text::bigint;
ALTER TABLE outbox_messages ALTER COLUMN lease_generation SET DEFAULT pg_current_xact_id()::text::bigint;
COMMENT ON COLUMN inbox_messages.lease_generation IS 'Fencing token: the enqueueing transaction''s id at first, +1 on every claim, never reset; every renew and outcome write must carry it.';
COMMENT ON COLUMN outbox_messages.lease_generation IS 'Fencing token: the enqueueing transaction''s id at first, +1 on every claim, never reset; every renew and outcome write must carry it.';

-- +goose Down
ALTER TABLE outbox_messages ALTER COLUMN lease_generation SET DEFAULT 0;
ALTER TABLE inbox_messages ALTER COLUMN lease_generation SET DEFAULT 0;
COMMENT ON COLUMN inbox_messages.lease_generation IS 'Fencing token: +1 on every claim, never reset; every renew and outcome write must carry it.';
COMMENT ON COLUMN outbox_messages.lease_generation IS 'Fencing token: +1 on every claim, never reset; every renew and outcome write must carry it.';
