#!/usr/bin/env bash
# soak.sh — the fault-injection soak for as long as asked (CI runs the same test for 40 s):
#
#   scripts/soak.sh DURATION        e.g. scripts/soak.sh 30m   (a Go duration: 90s, 2h, ...)
#
# Runs TestSoak (internal/engine/soak_test.go) through scripts/test.sh, on its private clusters:
# under a workload, with `pgconverge run` streaming through TCP proxies and running scheduled
# backfills and verifies with repair, and a `backfill --join` process joining each backfill run,
# it injects faults at random moments for DURATION (SIGKILL of the daemon, of a manual backfill
# and of the joined process, fast and crash restarts of the source, target restarts, connections
# cut on either side, target statements cancelled, deadlocks the daemon's waiting writes lose
# against a target session), then requires both tables equal, nothing found by verify, no
# coverage gap and the daemon running, and prints the faults of each kind (its last line).
# Exit status: go test's. PGCONVERGE_TEST_ROOT, PGCONVERGE_TEST_PORT and PGCONVERGE_KEEP are
# test.sh's.
set -euo pipefail
[ $# -eq 1 ] || { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
export PGCONVERGE_SOAK=$1
PGCONVERGE_SOAK_SUMMARY=$(mktemp)
export PGCONVERGE_SOAK_SUMMARY
trap 'rm -f "$PGCONVERGE_SOAK_SUMMARY"' EXIT
status=0
"$(dirname "${BASH_SOURCE[0]}")/test.sh" -run '^TestSoak$' -timeout 0 || status=$?
cat "$PGCONVERGE_SOAK_SUMMARY"
exit "$status"
