-- +goose Up
-- Validates the status CHECKs that 00010 added NOT VALID. VALIDATE
-- CONSTRAINT scans the table under SHARE UPDATE EXCLUSIVE, which lets
-- claims, writes and enqueues run on; in 00010's transaction it would have
-- scanned under that migration's ACCESS EXCLUSIVE lock.
ALTER TABLE inbox_messages VALIDATE CONSTRAINT inbox_messages_status_check;
ALTER TABLE outbox_messages VALIDATE CONSTRAINT outbox_messages_status_check;

-- +goose Down
SELECT 1;
