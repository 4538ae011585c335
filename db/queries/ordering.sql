-- OrderingStrict reports whether queue's strict_ordering is on: a
-- dead-lettered head then keeps its key blocked until it is requeued or
-- purged. false when the queue has no settings row.
-- name: OrderingStrict :one
SELECT coalesce((SELECT strict_ordering FROM leasestore_queue_settings WHERE queue = @queue::text), false)::boolean AS strict_ordering;

-- OrderingSetStrict sets queue's strict_ordering. It applies to dead
-- letters written from then on: keys already freed stay free. The keys
-- that dead-lettered heads hold when strict mode is turned off are freed
-- by the caller (the queue's DeadLetteredHeads, then KeyLock and KeyAdvance).
-- name: OrderingSetStrict :exec
INSERT INTO leasestore_queue_settings (queue, strict_ordering)
VALUES (@queue::text, @strict_ordering::boolean)
ON CONFLICT (queue) DO UPDATE SET strict_ordering = excluded.strict_ordering;
