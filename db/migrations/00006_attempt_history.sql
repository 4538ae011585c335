-- +goose Up
-- The attempt history: the last leasing.AttemptHistoryLimit (20) finished
-- attempts of each row, oldest first, as a jsonb array in the row itself.
-- Every outcome write (fail, release, dead-letter, orphan release) appends
-- its attempt's entry in the UPDATE it already makes, and a claim that
-- reclaims an expired lease appends that attempt's entry (outcome expired);
-- claims of pending and failed rows leave it alone. Complete (publish)
-- appended its entry too until 2026-12-04; since then a finished row's
-- lease columns are its last entry, which readers add
-- (docs/notes/2026-12-04-completion-entry.md).
-- A retried write decides already_applied from it: "did this lease (owner and
-- generation) write this outcome", which a later lease's writes cannot
-- overwrite, unlike outcome and outcome_generation, which hold the latest
-- write only. Those two are still written, for code of earlier versions
-- during a rolling deploy.
--
-- In the row rather than in a child table: the writes already rewrite the
-- row (MVCC), so the append costs the entry's bytes in the new row version
-- (about 220 bytes per entry plus its error, at most 20 entries) and no extra index
-- entries, no second table to lock, vacuum or purge with the row. A child
-- table would add an INSERT (heap and index) per attempt and a DELETE of
-- the oldest to keep the bound, and a join to every read.
--
-- ADD COLUMN with a constant default changes the catalog only (no table
-- rewrite); the ACCESS EXCLUSIVE lock it takes is held for milliseconds,
-- but it waits behind every open transaction on the table, and every claim
-- then waits behind it: the lock_timeout makes the migration fail (run it
-- again) instead of stalling the queue.
SET LOCAL lock_timeout = '10s';
ALTER TABLE inbox_messages ADD COLUMN attempts jsonb NOT NULL DEFAULT '[]';
ALTER TABLE outbox_messages ADD COLUMN attempts jsonb NOT NULL DEFAULT '[]';
-- NOT VALID: checked on every write from now on, without a scan of the
-- existing rows, which all hold the default.
ALTER TABLE inbox_messages ADD CONSTRAINT inbox_messages_attempts_check
    CHECK (jsonb_typeof(attempts) = 'array') NOT VALID;
ALTER TABLE outbox_messages ADD CONSTRAINT outbox_messages_attempts_check
    CHECK (jsonb_typeof(attempts) = 'array') NOT VALID;

-- Every claim and outcome write now updates attempts: give the processor
-- role of db/roles.sql that right here, so that processors of this version
-- keep working before db/roles.sql is run again (as it should be after
-- every migration). Roles of your own need UPDATE (attempts) too.
-- +goose StatementBegin
DO $grant$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = 'leasestore_processor') THEN
        GRANT UPDATE (attempts) ON inbox_messages, outbox_messages TO leasestore_processor;
    END IF;
END
$grant$;
-- +goose StatementEnd

COMMENT ON COLUMN inbox_messages.attempts IS 'Last 20 finished attempts, oldest first: objects with attempt, generation, owner, claimed_at, finished_at (database clock), outcome (completed, failed, released, dead_lettered, expired, requeued), error (at most 1 KiB), operator and forced (set by an operator action).';
COMMENT ON COLUMN outbox_messages.attempts IS 'Last 20 finished attempts, oldest first: objects with attempt, generation, owner, claimed_at, finished_at (database clock), outcome (published, failed, released, dead_lettered, expired, requeued), error (at most 1 KiB), operator and forced (set by an operator action).';

-- +goose Down
SET LOCAL lock_timeout = '10s';
ALTER TABLE outbox_messages DROP COLUMN attempts;
ALTER TABLE inbox_messages DROP COLUMN attempts;
