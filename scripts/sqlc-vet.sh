#!/usr/bin/env bash
# Runs `sqlc vet` (rule sqlc/db-prepare: every query must prepare) against a
# freshly migrated throwaway database, then drops it. The server is
# TEST_DATABASE_URL, else DATABASE_URL, else the local one.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

admin="${TEST_DATABASE_URL:-${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}}"
name="leasestore_vet_$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')"
vet_url="$(python3 - "$admin" "$name" <<'PY' 2>/dev/null || true
import sys, urllib.parse as u
p = u.urlsplit(sys.argv[1]); print(u.urlunsplit(p._replace(path="/" + sys.argv[2])))
PY
)"
if [ -z "$vet_url" ]; then
  vet_url="${admin%%\?*}"; vet_url="${vet_url%/*}/$name"
  case "$admin" in *\?*) vet_url="$vet_url?${admin#*\?}" ;; esac
fi

psql "$admin" -qc "CREATE DATABASE $name" >/dev/null
trap 'psql "$admin" -qc "DROP DATABASE IF EXISTS $name WITH (FORCE)" >/dev/null' EXIT
(cd cmd/leasectl && go run . migrate up --database-url "$vet_url" >/dev/null)
SQLC_VET_DATABASE_URL="$vet_url" GOWORK=off go tool -modfile=tools/go.mod sqlc vet
echo "sqlc vet: every query prepares against the migrated schema"
