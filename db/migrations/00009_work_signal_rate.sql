-- +goose Up
-- Rate-limited NOTIFY, decided in the database: on average at most one per
-- 10 ms per table, in bursts of up to five.
--
-- PostgreSQL commits the transactions that sent a NOTIFY one at a time: a
-- database-wide lock, held through the commit's WAL flush, orders the
-- notification queue. With a NOTIFY in every enqueue (00003), concurrent
-- single-message producers queue on that lock and lose half their rate or
-- more. Now an inserting statement notifies only when the signal's budget
-- allows (GCRA, the generic cell rate algorithm): a sequence per table
-- holds the theoretical time of the next notification, in microseconds of
-- the database clock; a statement notifies when that time is at most 40
-- ms ahead of now, and moves it 10 ms on from the later of the two.
-- Sequences are not transactional: producers read and set it without
-- waiting on each other's row locks or commits. Two statements that read
-- it at the same moment may both notify: harmless. Below about 100
-- enqueueing statements per second nearly every one notifies, as before;
-- above, about 100 notifying commits per second reach the lock, whatever
-- the rate.
--
-- What a statement without a notification relies on: the notifications
-- just before it, which wake processors at about the same time; the
-- processors, which after a claim that found work claim again 2, 4, ...
-- 64 ms later while they find nothing (rows that commit just after the
-- wake are taken then); and the poll, for a notifier that rolled back (its
-- setval stays, its NOTIFY is lost). A database clock that steps back by
-- more than a second resets the budget; a smaller step holds notifications
-- back for at most that step, and the poll covers them.
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
    now_us bigint := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
    -- The theoretical time of the next notification; NULL before the first.
    due bigint := pg_sequence_last_value(signal);
BEGIN
    IF due IS NULL OR due - now_us <= 40000 OR due - now_us > 1000000 THEN
        PERFORM setval(signal, CASE WHEN due IS NULL OR due < now_us OR due - now_us > 1000000
                                    THEN now_us ELSE due END + 10000);
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
