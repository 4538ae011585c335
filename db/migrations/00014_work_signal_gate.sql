-- +goose Up
-- Decide the work signal in the trigger's WHEN clause, so that a statement
-- whose notification the budget does not allow calls no function at all.
--
-- Migration 00009 called leasestore_signal_work for every inserting
-- statement; the function then found, nearly always under load, that the
-- budget allowed no notification. That call alone (plpgsql, SECURITY
-- DEFINER with its own search_path, the sequence looked up by name) cost
-- single-message producers about a fifth of their rate at 32 producers
-- on two cores, more than the notifications the budget lets through. A
-- WHEN clause is an expression the executor evaluates in place, with the
-- sequence resolved once, here; only a statement that may notify calls the
-- function, which checks the budget again and spends it (00009 explains
-- the budget).
--
-- The clause is the function's own test: call it when the sequence is
-- unset (NULL before the first notification), when the next
-- notification's time is at most 40 ms ahead of now, or when it is more
-- than a second ahead (the clock stepped back). The clause runs as the
-- inserting role, and pg_sequence_last_value needs SELECT on the sequence
-- (PostgreSQL 15 raises an error without it). Every role gets SELECT here
-- (the sequence holds only a time in microseconds), and db/roles.sql
-- grants it to the library's roles again; a role that still lacks it (a
-- restore without privileges, a REVOKE from PUBLIC) calls the function on
-- every statement, as before this migration, rather than failing its
-- inserts: the CASE tests the privilege first.
GRANT SELECT ON SEQUENCE inbox_messages_work_signal TO PUBLIC;
GRANT SELECT ON SEQUENCE outbox_messages_work_signal TO PUBLIC;

DROP TRIGGER inbox_messages_notify_work ON inbox_messages;
CREATE TRIGGER inbox_messages_notify_work
    AFTER INSERT ON inbox_messages
    FOR EACH STATEMENT
    WHEN (CASE WHEN has_sequence_privilege('inbox_messages_work_signal'::regclass::oid, 'SELECT')
               THEN coalesce(pg_sequence_last_value('inbox_messages_work_signal'), 0)
                    - (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
                    NOT BETWEEN 40001 AND 1000000
               ELSE true END)
    EXECUTE FUNCTION leasestore_signal_work();
DROP TRIGGER outbox_messages_notify_work ON outbox_messages;
CREATE TRIGGER outbox_messages_notify_work
    AFTER INSERT ON outbox_messages
    FOR EACH STATEMENT
    WHEN (CASE WHEN has_sequence_privilege('outbox_messages_work_signal'::regclass::oid, 'SELECT')
               THEN coalesce(pg_sequence_last_value('outbox_messages_work_signal'), 0)
                    - (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
                    NOT BETWEEN 40001 AND 1000000
               ELSE true END)
    EXECUTE FUNCTION leasestore_signal_work();

-- +goose Down
DROP TRIGGER outbox_messages_notify_work ON outbox_messages;
CREATE TRIGGER outbox_messages_notify_work
    AFTER INSERT ON outbox_messages
    FOR EACH STATEMENT EXECUTE FUNCTION leasestore_signal_work();
DROP TRIGGER inbox_messages_notify_work ON inbox_messages;
CREATE TRIGGER inbox_messages_notify_work
    AFTER INSERT ON inbox_messages
    FOR EACH STATEMENT EXECUTE FUNCTION leasestore_signal_work();
REVOKE SELECT ON SEQUENCE outbox_messages_work_signal FROM PUBLIC;
REVOKE SELECT ON SEQUENCE inbox_messages_work_signal FROM PUBLIC;
