#!/usr/bin/env bash
# Makes sure the PostgreSQL server the integration tests use answers, then
# exits 0. The server is TEST_DATABASE_URL, else DATABASE_URL, else
# postgres://postgres@127.0.0.1:5432/postgres with trust auth. In order:
#   1. a server that already answers is left alone;
#   2. the Debian cluster on that port is started with pg_ctlcluster, and
#      stopped again if it does not accept that URL;
#   3. a throwaway server (trust auth, fsync off) is initialised in
#      $LEASESTORE_PGDATA (default $TMPDIR/leasestore-pgdata) and started.
# LEASESTORE_PGPORT picks another port than 5432.
# As root, installs Debian's postgresql package when no server binaries exist.
set -euo pipefail

host=127.0.0.1
port="${LEASESTORE_PGPORT:-5432}"
url="${TEST_DATABASE_URL:-${DATABASE_URL:-postgres://postgres@$host:$port/postgres?sslmode=disable}}"
pgdata="${LEASESTORE_PGDATA:-${TMPDIR:-/tmp}/leasestore-pgdata}"

log() { echo "db-start: $*" >&2; }

accepts() { command -v psql >/dev/null && psql "$url" -qAtc 'SELECT 1' >/dev/null 2>&1; }

answers() { command -v pg_isready >/dev/null && pg_isready -q -h "$host" -p "$port"; }

wait_answers() {
  for _ in $(seq 1 60); do
    answers && return 0
    sleep 0.5
  done
  return 1
}

# Runs a command as the postgres OS user when root: initdb and pg_ctl refuse root.
as_postgres() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

if accepts; then
  log "ready: server already answers"
  exit 0
fi
if [ -n "${TEST_DATABASE_URL:-}${DATABASE_URL:-}" ] && [[ "$url" != *"$host:$port"* ]]; then
  log "TEST_DATABASE_URL/DATABASE_URL points at a server this script does not manage, and it does not answer"
  exit 1
fi

if ! ls -d /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  if [ "$(id -u)" != 0 ]; then
    log "no PostgreSQL server binaries; install Debian's postgresql package (apt-get install postgresql)"
    exit 1
  fi
  log "installing Debian's postgresql package"
  bash "$(dirname "${BASH_SOURCE[0]}")/apt-install.sh" postgresql
fi
bindir="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"

if ! answers && command -v pg_lsclusters >/dev/null; then
  cluster="$(pg_lsclusters -h | awk -v p="$port" '$3 == p { print $1, $2; exit }')"
  if [ -n "$cluster" ]; then
    read -r version name <<<"$cluster"
    log "starting cluster $version/$name"
    if pg_ctlcluster --skip-systemctl-redirect "$version" "$name" start && wait_answers; then
      if accepts; then
        log "ready: cluster $version/$name"
        exit 0
      fi
      log "cluster $version/$name does not accept $url (not trust auth?); stopping it again"
      pg_ctlcluster --skip-systemctl-redirect "$version" "$name" stop || true
    fi
  fi
fi

if answers; then
  log "a server answers on $host:$port but does not accept $url; set TEST_DATABASE_URL, e.g."
  log "  export TEST_DATABASE_URL='postgres://USER:PASSWORD@$host:$port/postgres?sslmode=disable'"
  exit 1
fi

if [ ! -s "$pgdata/PG_VERSION" ]; then
  log "initialising a throwaway server in $pgdata"
  mkdir -p "$pgdata"
  if [ "$(id -u)" = 0 ]; then chown postgres: "$pgdata"; fi
  as_postgres "$bindir/initdb" -D "$pgdata" -U postgres --auth=trust -E UTF8 --no-sync >/dev/null
fi
log "starting the throwaway server in $pgdata"
as_postgres "$bindir/pg_ctl" -D "$pgdata" -l "$pgdata/server.log" -w -t 60 start \
  -o "-c listen_addresses=$host -c port=$port -c unix_socket_directories=$pgdata -c max_connections=200 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" >/dev/null
if wait_answers && accepts; then
  log "ready: throwaway server in $pgdata (stop: $bindir/pg_ctl -D $pgdata stop)"
  exit 0
fi
log "the server did not become ready; see $pgdata/server.log"
exit 1
