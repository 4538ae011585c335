-- PausePut pauses each (queue, topic) of topics ('' for the whole queue)
-- that is not paused yet, as paused_by at the database's clock. A pause
-- already in place keeps its paused_by and paused_at. Returns the pauses
-- it added.
-- name: PausePut :many
INSERT INTO leasestore_paused (queue, topic, paused_by, paused_at)
SELECT @queue::text, t.topic, @paused_by::text, coalesce(sqlc.narg('now')::timestamptz, statement_timestamp())
FROM unnest(@topics::text[]) AS t(topic)
ORDER BY t.topic
ON CONFLICT (queue, topic) DO NOTHING
RETURNING topic;

-- PauseDelete resumes each (queue, topic) of topics ('' for the whole
-- queue) and, when it removed any, notifies the queue's work channel so
-- that processors claim at once. Returns the pauses it removed.
-- name: PauseDelete :many
WITH removed AS (
    DELETE FROM leasestore_paused AS p
    WHERE p.queue = @queue::text AND p.topic = ANY(@topics::text[])
    RETURNING p.topic
), notified AS (
    SELECT pg_notify(@channel::text, '') FROM (SELECT 1 FROM removed LIMIT 1) AS any_removed
)
SELECT r.topic FROM removed AS r
WHERE (SELECT count(*) FROM notified) >= 0
ORDER BY r.topic;

-- PauseList returns queue's pauses in place, by topic ('' for the whole
-- queue, first).
-- name: PauseList :many
SELECT topic, paused_by, paused_at
FROM leasestore_paused
WHERE queue = @queue::text
ORDER BY topic;
