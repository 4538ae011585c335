-- +goose Up
-- One payload-less NOTIFY per inserting statement (not per row: per-row notifies
-- serialise bulk enqueues on the notify queue lock). The channel is the table name.
-- +goose StatementBegin
CREATE FUNCTION leasestore_notify_work() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_TABLE_NAME, '');
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER inbox_messages_notify_work
    AFTER INSERT ON inbox_messages
    FOR EACH STATEMENT EXECUTE FUNCTION leasestore_notify_work();
CREATE TRIGGER outbox_messages_notify_work
    AFTER INSERT ON outbox_messages
    FOR EACH STATEMENT EXECUTE FUNCTION leasestore_notify_work();

-- +goose Down
DROP TRIGGER outbox_messages_notify_work ON outbox_messages;
DROP TRIGGER inbox_messages_notify_work ON inbox_messages;
DROP FUNCTION leasestore_notify_work();
