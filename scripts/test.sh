#!/usr/bin/env bash
# test.sh — pgconverge's test entry point (the README's second command; CI runs it via .ci/run).
#
#   scripts/test.sh [go test flags...]      e.g. scripts/test.sh -run TestApply -v
#
# 1. checks formatting (`gofmt -l .` must list nothing) and runs `go vet ./...`; checks that
#    docs/cli is what scripts/gen-cli-docs.sh writes ("docs/cli is stale" otherwise) and that every
#    relative link of the Markdown files resolves (scripts/checklinks.go);
# 2. starts two private PostgreSQL 15 clusters with scripts/pgcluster.sh under ROOT:
#    `source` on 127.0.0.1:54341 (wal_level=logical) and `target` on 127.0.0.1:54342;
# 3. runs `go test -race -count=1 -p 1 -parallel 8 -timeout 30m ./... "$@"` through gotestsum, one line per
#    test as it ends (then, without extra arguments, 300,000 inputs of the pgoutput fuzz test,
#    80,000 of the coverage gap fuzz test, about 15 s and 10 s here, and the benchmark's smoke run, `BENCH_QUICK=1 BENCH_PORT=24401
#    scripts/bench.sh`, about a minute on clusters of its own) against them, with these variables
#    exported:
#      PGCONVERGE_TEST_SOURCE          URL of the source cluster
#      PGCONVERGE_TEST_TARGET          URL of the target cluster
#      PGCONVERGE_TEST_RESTART_SOURCE  shell command that restarts the source cluster
#      PGCONVERGE_TEST_RESTART_TARGET  shell command that restarts the target cluster
#      PGCONVERGE_REQUIRE_INTEGRATION  1: integration tests fail (never skip) without the URLs
#      PGCONVERGE_TEST_CLUSTER         path of scripts/pgcluster.sh, with which a test makes a
#                                      physical standby of the source (pgtest.NewStandby)
#      PGCONVERGE_TEST_CLUSTER_ROOT    ROOT, the clusters' folder
#      PGCONVERGE_TEST_STANDBY_PORT    the port of that standby: the source port + 2
# 4. without extra arguments, the version matrix: scripts/test-versions.sh runs the conformance
#    subset on PostgreSQL 14, 16, 17 and 18 and on the mixed pairs 14 → 18, 15 → 17 and 18 → 16,
#    each on clusters of its own (about 1–2 minutes a pair);
# and exits with go test's status (1 when a pair of step 4 failed). The clusters are stopped and
# ROOT removed on exit.
#
# Environment:
#   PGCONVERGE_TEST_ROOT  clusters' folder (default /tmp/pgconverge-test); a running cluster there
#                         is stopped and wiped, so give concurrent runs their own ROOT and port
#   PGCONVERGE_TEST_PORT  source port (default 54341); the target uses the next one
#   PGCONVERGE_TEST_PARALLEL  integration tests run at once within a package (go test -parallel;
#                             default 8)
#   PGCONVERGE_TEST_PACKAGES  the packages to test (default ./...)
#   PGCONVERGE_TEST_STATIC=0  skip step 1 (gofmt, vet, docs)
#   PGCONVERGE_TEST_VERSIONS  the version pairs of step 4 (scripts/test-versions.sh; "none": skip)
#   PGCONVERGE_KEEP=1  keep the clusters' folder ROOT (data and logs) after the run; the servers
#                      are still stopped
#   PGCONVERGE_TEST_PG  the clusters' PostgreSQL major version, 14 to 18 (default 15; others are
#                       downloaded once by scripts/pgservers.sh)
#   PGCONVERGE_TEST_SOURCE_PG, PGCONVERGE_TEST_TARGET_PG  one side's version (default
#                       PGCONVERGE_TEST_PG), for a mixed pair such as 14 → 18
#   PGBIN              PostgreSQL 15's binaries (default /usr/lib/postgresql/15/bin)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then
	export PATH="/usr/local/go/bin:$PATH"
fi

ROOT=${PGCONVERGE_TEST_ROOT:-/tmp/pgconverge-test}
PGCLUSTER=$REPO/scripts/pgcluster.sh
SOURCE_PORT=${PGCONVERGE_TEST_PORT:-54341}
TARGET_PORT=$((SOURCE_PORT + 1))

if [ "${PGCONVERGE_TEST_STATIC:-1}" != 0 ]; then
	echo "== gofmt -l ."
	unformatted=$(gofmt -l .)
	if [ -n "$unformatted" ]; then
		echo "these files are not gofmt-formatted (run: gofmt -w .):" >&2
		echo "$unformatted" >&2
		exit 1
	fi

	echo "== go vet ./..."
	go vet ./...
	go vet -tags gendocs ./cmd/pgconverge

	echo "== docs: docs/cli current, relative links resolve"
	clidocs=$(mktemp -d)
	if ! scripts/gen-cli-docs.sh "$clidocs" || ! diff -r "$clidocs" docs/cli >&2; then
		rm -rf "$clidocs"
		echo "docs/cli is stale: run scripts/gen-cli-docs.sh" >&2
		exit 1
	fi
	rm -rf "$clidocs"
	go run scripts/checklinks.go
fi

# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
	local rc=$?
	set +e
	"$PGCLUSTER" stop source "$ROOT"
	"$PGCLUSTER" stop target "$ROOT"
	# A standby a test made (pgtest.NewStandby) and did not stop, as when the test binary died.
	for version in "$ROOT"/*/PG_VERSION; do
		[ -f "$version" ] || continue
		name=$(basename "$(dirname "$version")")
		[ "$name" = source ] || [ "$name" = target ] || "$PGCLUSTER" stop "$name" "$ROOT"
	done
	if [ "${PGCONVERGE_KEEP:-}" = 1 ]; then
		echo "PGCONVERGE_KEEP=1: keeping $ROOT (cluster data and logs)" >&2
	else
		rm -rf "$ROOT"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

SOURCE_PG=${PGCONVERGE_TEST_SOURCE_PG:-${PGCONVERGE_TEST_PG:-15}}
TARGET_PG=${PGCONVERGE_TEST_TARGET_PG:-${PGCONVERGE_TEST_PG:-15}}
echo "== starting PostgreSQL clusters under $ROOT: source $SOURCE_PG, target $TARGET_PG"
PG_SERVER_VERSION=$SOURCE_PG "$PGCLUSTER" start source "$SOURCE_PORT" "$ROOT" logical
PG_SERVER_VERSION=$TARGET_PG "$PGCLUSTER" start target "$TARGET_PORT" "$ROOT"

# The tests create and drop hundreds of databases, each of which the autovacuum launcher would
# visit with a worker process of its own; a test that needs a VACUUM runs it.
for side in source target; do
	port=$SOURCE_PORT
	[ "$side" = target ] && port=$TARGET_PORT
	psql -X -q -d "$("$PGCLUSTER" url "$side" "$port")" -c 'alter system set autovacuum = off' -c 'select pg_reload_conf()' >/dev/null
done

PGCONVERGE_TEST_SOURCE=$("$PGCLUSTER" url source "$SOURCE_PORT")
PGCONVERGE_TEST_TARGET=$("$PGCLUSTER" url target "$TARGET_PORT")
PGCONVERGE_TEST_RESTART_SOURCE=$(printf '%q restart source %q' "$PGCLUSTER" "$ROOT")
PGCONVERGE_TEST_RESTART_TARGET=$(printf '%q restart target %q' "$PGCLUSTER" "$ROOT")
PGCONVERGE_REQUIRE_INTEGRATION=1
PGCONVERGE_TEST_CLUSTER=$PGCLUSTER
PGCONVERGE_TEST_CLUSTER_ROOT=$ROOT
PGCONVERGE_TEST_STANDBY_PORT=$((SOURCE_PORT + 2))
export PGCONVERGE_TEST_CLUSTER PGCONVERGE_TEST_CLUSTER_ROOT PGCONVERGE_TEST_STANDBY_PORT
export PGCONVERGE_TEST_SOURCE PGCONVERGE_TEST_TARGET PGCONVERGE_TEST_RESTART_SOURCE PGCONVERGE_TEST_RESTART_TARGET PGCONVERGE_REQUIRE_INTEGRATION

# -p 1: packages run one at a time, because some tests restart the shared clusters. Within a
# package, the integration tests that own their databases and slot call t.Parallel(); go test runs
# a package's serial tests first (those that restart a cluster, ALTER SYSTEM, count cluster-wide
# things, need VACUUM to free space or measure time), then the parallel ones, PARALLEL at a time. They mostly wait (for the
# server, for polls, for timings), not compute, so PARALLEL is far above the 2 cores' GOMAXPROCS;
# the clusters' max_connections and slots (scripts/pgcluster.sh) leave room for it. gotestsum (a
# go.mod tool) prints each test as it ends, so the long integration package is not silent; it
# prints the output of failed tests again at the end, and exits with go test's status.
PARALLEL=${PGCONVERGE_TEST_PARALLEL:-8}
PACKAGES=${PGCONVERGE_TEST_PACKAGES:-./...}
echo "== go test -race -count=1 -p 1 -parallel $PARALLEL -timeout 30m $PACKAGES $* (one line per test as it ends)"
status=0
# shellcheck disable=SC2086  # PACKAGES may name several
go tool gotestsum --format testname --format-hide-empty-pkg -- -race -count=1 -p 1 -parallel "$PARALLEL" -timeout 30m $PACKAGES "$@" || status=$?
if [ "$status" -eq 0 ] && [ $# -eq 0 ]; then
	# Fuzz budgets are counts of inputs, not durations: a duration's deadline races the fuzzing
	# coordinator's workers in Go 1.26 and fails the target with a bare "context deadline
	# exceeded" and no failing input (go.dev/issue/75804, fixed in Go 1.27).
	echo "== go test -run '^$' -fuzz FuzzAssemble -fuzztime 300000x ./cdc (pgoutput decoding and assembly)"
	go test -run '^$' -fuzz FuzzAssemble -fuzztime 300000x ./cdc || status=$?
	echo "== go test -run '^$' -fuzz FuzzGaps -fuzztime 80000x ./coverage/gaps (coverage gap computation)"
	go test -run '^$' -fuzz FuzzGaps -fuzztime 80000x ./coverage/gaps || status=$?
	# Ports below the kernel's ephemeral range (ip_local_port_range, 32768-60999 here): after the
	# tests' thousands of connections, a port in it can be held by a client socket, and the
	# cluster could not bind it.
	echo "== BENCH_QUICK=1 BENCH_PORT=24401 scripts/bench.sh (the benchmark's smoke run: every phase, each checked equal to the source)"
	BENCH_QUICK=1 BENCH_PORT=24401 scripts/bench.sh >"$ROOT/bench-quick.log" 2>&1 || { status=$?; tail -n 40 "$ROOT/bench-quick.log"; }
	grep -A 20 '^== summary' "$ROOT/bench-quick.log" || true
fi
if [ $# -eq 0 ]; then
	# Each pair on clusters of its own, 20 ports above this run's.
	scripts/test-versions.sh || status=1
fi
if [ "$status" -ne 0 ]; then
	echo "go test failed (exit $status); server logs: $ROOT/source.log, $ROOT/target.log" \
		"(set PGCONVERGE_KEEP=1 to keep them)" >&2
fi
exit "$status"
