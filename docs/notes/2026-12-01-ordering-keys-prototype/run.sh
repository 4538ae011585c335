#!/bin/bash
# Drains N messages (default 200,000; over KEYS ordering keys, default
# 1,000, for the keyed variants) with pgbench, CLIENTS clients (4) claiming
# BATCH (100) a time, once per VARIANT named, in one database of its own,
# emptied and filled afresh for each variant, and prints messages/s: N over the time from the
# first claim to the last completion, on the database's clock. The variants
# are described in scripts.py. A loop VACUUMs the tables every 250 ms
# during each drain, so that no variant drains through its dead rows (the
# processors' vacuum policy vacuums at 5,000 dead rows, checked every
# 250 ms). A drain that does not complete every message fails the run.
# out_of_order counts keyed messages completed before the one ahead of
# them in their key (0 for U, which has none). Drains under a second (N
# below about 20,000) are noisy.
# Needs pgbench, psql, python3 and go; DATABASE_URL names the server
# (default postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable).
#
#   docs/notes/2026-12-01-ordering-keys-prototype/run.sh U K0 K1 K2 K4 K5 K5 K4 K2 K1 K0 U
set -euo pipefail
N=${N:-200000}; KEYS=${KEYS:-1000}; CLIENTS=${CLIENTS:-4}; BATCH=${BATCH:-100}
ADMIN=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
DB=leasestore_proto_$$
URL=$(python3 -c 'import sys, urllib.parse as u; p = u.urlsplit(sys.argv[1]); print(u.urlunsplit(p._replace(path="/" + sys.argv[2])))' "$ADMIN" "$DB")
work= vpid= created=
cleanup() {
  if [ -n "$vpid" ]; then kill "$vpid" 2>/dev/null || true; fi
  if [ -n "$created" ]; then psql "$ADMIN" -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" || true; fi
  if [ -n "$work" ]; then rm -rf "$work"; fi
}
trap cleanup EXIT
if [ $# -eq 0 ]; then
  echo "usage: run.sh VARIANT... (U K0 K1 K2 K4 K5: see scripts.py)" >&2
  exit 2
fi
for v in "$@"; do
  case $v in U|K0|K1|K2|K4|K5) ;; *) echo "run.sh: unknown variant $v (U K0 K1 K2 K4 K5)" >&2; exit 2 ;; esac
done
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
work=$(mktemp -d)
cp "$repo/internal/bench/pgbench/inbox_claim_complete.pgbench" "$work/U.pgbench"
python3 "$here/scripts.py" "$repo" "$work"
(cd "$repo/cmd/leasectl" && go build -o "$work/leasectl" .)

psql "$ADMIN" -qc "CREATE DATABASE $DB"
created=1
"$work/leasectl" migrate up --database-url "$URL" >/dev/null
psql "$URL" -q -v ON_ERROR_STOP=1 <<'SQL'
CREATE TABLE inbox_ready_heads (message_id uuid PRIMARY KEY, created_at timestamptz NOT NULL,
                                tenant_id text NOT NULL, ordering_key text NOT NULL);
CREATE INDEX inbox_ready_heads_order_idx ON inbox_ready_heads (created_at, message_id);
SQL

# fill V: N due messages as the bench fills them; for the keyed variants
# key-(i mod KEYS) with its place in the key's line, the first message of
# each key its head (pending; for K1 waiting, and listed in
# inbox_ready_heads), and the key rows.
fill() {
  local v=$1 keyed=1 headstatus=pending
  [ "$v" = U ] && keyed=0
  [ "$v" = K1 ] && headstatus=waiting
  psql "$URL" -q -v ON_ERROR_STOP=1 <<SQL
TRUNCATE inbox_messages, inbox_ordering_keys, inbox_ready_heads;
INSERT INTO inbox_messages (message_id, message_type, payload, created_at, visible_after, status, ordering_key, key_seq)
SELECT gen_random_uuid(), 'bench', convert_to(repeat('x', 64), 'UTF8'), c.created_at, c.created_at,
       CASE WHEN $keyed = 0 THEN 'pending' WHEN c.i < $KEYS THEN '$headstatus' ELSE 'waiting' END,
       CASE WHEN $keyed = 1 THEN 'key-' || (c.i % $KEYS) END,
       CASE WHEN $keyed = 1 THEN c.i / $KEYS + 1 END
FROM (SELECT now() - interval '30 days' + g * interval '1 millisecond' AS created_at, g AS i
      FROM generate_series(0, $N - 1) AS g) AS c;
INSERT INTO inbox_ordering_keys (tenant_id, ordering_key, last_seq, head_id, head_since)
SELECT '', ordering_key, max(key_seq), (array_agg(message_id ORDER BY key_seq))[1], now()
FROM inbox_messages WHERE ordering_key IS NOT NULL GROUP BY ordering_key;
INSERT INTO inbox_ready_heads SELECT message_id, created_at, '', ordering_key
FROM inbox_messages WHERE '$v' = 'K1' AND key_seq = 1;
VACUUM (ANALYZE) inbox_messages; VACUUM (ANALYZE) inbox_ordering_keys; VACUUM (ANALYZE) inbox_ready_heads;
CHECKPOINT;
SQL
}

for v in "$@"; do
  fill "$v"
  ( while :; do
      psql "$URL" -q -c "VACUUM inbox_messages" -c "VACUUM inbox_ordering_keys" -c "VACUUM inbox_ready_heads" >/dev/null 2>&1 || true
      sleep 0.25
    done ) &
  vpid=$!
  # Twice the transactions a drain needs when each claim takes what it
  # can: a full batch, or, keyed, at most one message per key, about
  # KEYS / CLIENTS of them (K2 and K5 drain their last keys at part of a
  # batch). The rate is taken from the rows' times, so the empty claims at
  # the end do not count.
  per=$BATCH
  if [ "$v" != U ] && [ $(( KEYS / CLIENTS )) -lt "$per" ]; then per=$(( KEYS / CLIENTS > 0 ? KEYS / CLIENTS : 1 )); fi
  T=$(( 2 * N / per / CLIENTS + 20 ))
  pgbench -n -M prepared -c "$CLIENTS" -j "$CLIENTS" -t "$T" -D batch="$BATCH" -D owner=w -D lease_for='5 minutes' \
    -D cn=0 -D cids='{}' -D cgens='{}' -f "$work/$v.pgbench" "$URL" > "$work/pgbench.out" 2>&1 || { cat "$work/pgbench.out"; exit 1; }
  kill "$vpid" 2>/dev/null || true; wait "$vpid" 2>/dev/null || true; vpid=
  read -r done rate early <<<"$(psql "$URL" -AtF' ' -c "
    SELECT count(*) FILTER (WHERE status = 'completed'),
           round(count(*) FILTER (WHERE status = 'completed')
                 / extract(epoch FROM max(completed_at) - min(last_attempted_at))),
           (SELECT count(*) FROM (SELECT completed_at < lag(completed_at) OVER (PARTITION BY ordering_key ORDER BY key_seq) AS early
                                  FROM inbox_messages WHERE ordering_key IS NOT NULL) AS s WHERE early)
    FROM inbox_messages")"
  if [ "$done" -ne "$N" ]; then
    echo "run.sh: $v completed $done of $N messages" >&2
    exit 1
  fi
  echo "$v $rate msg/s completed=$done out_of_order=$early load=$(cut -d' ' -f1 /proc/loadavg)"
done
