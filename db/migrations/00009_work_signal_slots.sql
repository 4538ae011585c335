-- +goose Up
-- At most one NOTIFY per 2 ms slot per channel, decided in the database.
--
-- PostgreSQL commits the transactions that sent a NOTIFY one at a time: a
-- database-wide lock, held through the commit's WAL flush, orders the
-- notification queue. With a NOTIFY in every enqueue (00003), concurrent
-- single-message producers queue on that lock and lose half their rate.
-- Now an inserting statement notifies only when no statement has claimed
-- the current 2 ms slot of the clock: the slot number is kept in a sequence
-- per table, read and set outside the transaction (sequences are not
-- transactional), so producers never wait on each other's row locks or
-- commits for it. Two statements that read the slot at the same moment may
-- both notify: harmless. At most about 500 notifying commits per second
-- reach the lock, whatever the enqueue rate; below that rate nearly every
-- enqueue still notifies.
--
-- What a skipped statement relies on: the notification of the statement
-- that claimed its slot, which wakes processors at about the same time;
-- the processors, which after a claim that found work claim again 2 ms
-- later, backing off while they find nothing (rows that commit just after
-- the wake are taken then); and the poll, for the rare slot whose notifier
-- rolled back (its setval stays, its NOTIFY is lost).
--
-- The function is SECURITY DEFINER so that a role allowed to INSERT needs
-- no privilege on the sequences; it sets its own search_path and names the
-- sequence with the table's schema.
CREATE SEQUENCE inbox_messages_work_signal AS bigint;
CREATE SEQUENCE outbox_messages_work_signal AS bigint;

-- +goose StatementBegin
CREATE FUNCTION leasestore_signal_work() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    signal regclass := format('%I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME || '_work_signal')::regclass;
    -- The 2 ms slot of the database clock; a clock that steps back just
    -- starts other slots.
    slot bigint := floor(extract(epoch FROM clock_timestamp()) * 500)::bigint;
BEGIN
    IF pg_sequence_last_value(signal) IS DISTINCT FROM slot THEN
        PERFORM setval(signal, slot);
        PERFORM pg_notify(TG_TABLE_NAME, '');
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- The triggers keep their names; 00003's function stays for the Down step.
DROP TRIGGER inbox_messages_notify_work ON inbox_messages;
CREATE TRIGGER inbox_messages_notify_work
    AFTER INSERT ON inbox_messages
    FOR EACH STATEMENT EXECUTE FUNCTION leasestore_signal_work();
DROP TRIGGER outbox_messages_notify_work ON outbox_messages;
CREATE TRIGGER outbox_messages_notify_work
    AFTER INSERT ON outbox_messages
    FOR EACH STATEMENT EXECUTE FUNCTION leasestore_signal_work();

-- +goose Down
DROP TRIGGER outbox_messages_notify_work ON outbox_messages;
CREATE TRIGGER outbox_messages_notify_work
    AFTER INSERT ON outbox_messages
    FOR EACH STATEMENT EXECUTE FUNCTION leasestore_notify_work();
DROP TRIGGER inbox_messages_notify_work ON inbox_messages;
CREATE TRIGGER inbox_messages_notify_work
    AFTER INSERT ON inbox_messages
    FOR EACH STATEMENT EXECUTE FUNCTION leasestore_notify_work();
DROP FUNCTION leasestore_signal_work();
DROP SEQUENCE outbox_messages_work_signal;
DROP SEQUENCE inbox_messages_work_signal;
