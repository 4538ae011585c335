#!/usr/bin/env bash
# Runs the long forms of the reliability tests (integration/reliability:
# stress_*test.go, fault_*test.go; integration/differential) and prints
# their figures:
#
#   1. TestStress (100,000 messages per queue, 16 workers), TestStressOutageHour
#      (an hour's broker outage at the default policies, on Memory's clock), TestFaultChaos
#      (20,000 messages per fault: terminated backends, dropped replies,
#      crashing workers) and TestDifferential (200 seeds x 300 operations);
#   2. TestFaultServerRestart alone: it restarts the shared PostgreSQL
#      server (pg_ctlcluster 15 main) twice, which breaks every session on
#      it, so nothing else of ours runs meanwhile; the server is started
#      again if it does not come back;
#   3. TestSoakAllOperations for SOAK (default 3m): every store operation at
#      once on both queues; fails on a deadlock or a failed call;
#   4. integration/failover for FAILOVER_ROUNDS (default 5) rounds of
#      FAILOVER_MESSAGES (default 10000) messages per queue: each round
#      fails a synchronous primary over mid-drain, through a multi-host URL
#      and through a switching proxy, then measures an asynchronous loss;
#      it needs PostgreSQL 15's binaries (/usr/lib/postgresql/15/bin or
#      LEASESTORE_PG_BIN);
#   5. FuzzDifferential for FUZZTIME (default 60s); failing inputs land in
#      integration/differential/testdata/fuzz/FuzzDifferential/ and stay there as
#      regression cases.
#
# RACE=1 adds the race detector (about 5x slower). SKIP_RESTART=1 skips
# step 2, e.g. on a server other people use.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../integration"

bash ../scripts/db-start.sh
export LEASESTORE_STRESS=1
race=()
if [ "${RACE:-0}" = 1 ]; then race=(-race); fi

figures() { grep -E '^\s+(stress_test|stress_outage_test|stress_tx_test|fault_test|differential_test)\.go:[0-9]+: (stress|  )|^(---|ok|FAIL|PASS)|^    --- ' || true; }

echo "== stress, chaos and differential (long forms)"
go test "${race[@]}" -count=1 -timeout 90m -v -run 'TestStress|TestFaultChaos|TestDifferential' ./reliability/ ./differential/ 2>&1 | figures

if [ "${SKIP_RESTART:-0}" != 1 ]; then
  echo "== server restart during a stress run"
  go test "${race[@]}" -count=1 -timeout 30m -v -run 'TestFaultServerRestart' ./reliability/ 2>&1 | figures
  bash ../scripts/db-start.sh
fi

echo "== every operation at once on both queues (TestSoakAllOperations, SOAK=${SOAK:-3m})"
LEASESTORE_SOAK_DURATION="${SOAK:-3m}" go test "${race[@]}" -count=1 -timeout 30m -v -run 'TestSoakAllOperations' ./reliability/ 2>&1 \
  | grep -E 'soak_test\.go:[0-9]+: soak|^(---|ok|FAIL|PASS)' || true

echo "== failovers under load (FAILOVER_ROUNDS=${FAILOVER_ROUNDS:-5}, FAILOVER_MESSAGES=${FAILOVER_MESSAGES:-10000} per queue)"
LEASESTORE_FAILOVER_ROUNDS="${FAILOVER_ROUNDS:-5}" LEASESTORE_FAILOVER_MESSAGES="${FAILOVER_MESSAGES:-10000}" \
  go test "${race[@]}" -count=1 -timeout 30m -v -run 'TestFailoverSyncDrain|TestFailoverAsyncLoss' ./failover/ 2>&1 \
  | grep -E '(failover|async)_test\.go:[0-9]+: |^(---|ok|FAIL|PASS)|^    --- ' || true

echo "== fuzzing the differential test for ${FUZZTIME:-60s}"
go test -count=1 -run '^$' -fuzz '^FuzzDifferential$' -fuzztime "${FUZZTIME:-60s}" -fuzzminimizetime 5s -parallel 1 ./differential/
