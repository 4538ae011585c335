-- +goose NO TRANSACTION
-- +goose Up
-- The expiry index answers one question before each claim reads its expired
-- branch: has any lease expired? It is keyed by lease_expires_at alone, so the
-- answer costs a descent to the earliest expiry, however many leases are live
-- (plus the entries of finished leases whose expiry has passed and that VACUUM
-- has not removed yet).
-- Without it the expired branch walks *_inflight_idx from its head, and every
-- row completed since the last VACUUM left an entry there whose (future)
-- expiry keeps the scan from ever visiting, and so killing, it: claims then
-- read one index page per ~200 rows processed since the last VACUUM.
--
-- The predicate selects exactly the leased rows (the lease CHECK makes
-- lease_expires_at non-null only while in flight, and gives every lease an
-- owner). It names lease_owner so that the expired branch, which filters on
-- status, can never be planned over this index (a Sort of every expired lease
-- under LockRows), and the probe, which filters on lease_owner, can never be
-- planned over *_inflight_idx.
CREATE INDEX CONCURRENTLY IF NOT EXISTS inbox_messages_expiry_idx
    ON inbox_messages (lease_expires_at)
    WHERE lease_expires_at IS NOT NULL AND lease_owner IS NOT NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_messages_expiry_idx
    ON outbox_messages (lease_expires_at)
    WHERE lease_expires_at IS NOT NULL AND lease_owner IS NOT NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS outbox_messages_expiry_idx;
DROP INDEX CONCURRENTLY IF EXISTS inbox_messages_expiry_idx;
