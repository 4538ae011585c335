-- SignalProbe sends a notification with payload on channel; the sessions
-- that LISTEN on channel receive it when the calling transaction commits.
-- leasing.Listener sends one from a second session after each LISTEN, to
-- learn whether its own session receives notifications: behind a
-- transaction pooler it LISTENs on a server session it then gives back.
-- name: SignalProbe :exec
SELECT pg_notify(@channel::text, @payload::text);
