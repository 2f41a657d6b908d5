#!/usr/bin/env bash
# bench-switchover.sh — a migration's switchover measured: how long `pgconverge cutover
# --pause-writes` pauses the application's writes, and how long the whole cutover takes, until
# the target's `verify --schema` exits 0.
#
# 1. starts private clusters `source` (127.0.0.1:54431, wal_level=logical) and `target` (:54432)
#    under /tmp/pgconverge-bench-switchover; loads `pgbench -i -s BENCH_SCALE --foreign-keys`
#    (default scale 20: 2,000,000 accounts) into the source and gives it what a real schema has
#    besides: an identity key on pgbench_history, a default, a CHECK and a secondary index; creates
#    the application's role `app` with the rights to write;
# 2. starts `pgconverge run --copy-indexes` and waits until the tables are loaded and the
#    secondary index is built on the target;
# 3. runs pgbench as `app` on the source at a fixed rate (BENCH_RATE, default 200 transactions/s),
#    stops the daemon after 20 s and, with pgbench still writing, runs `pgconverge cutover
#    --pause-writes app` (pgbench's clients stop on the first refused write);
# 4. prints the cutover's time, the write pause it reports, pgbench's transactions, and
#    `verify --schema`'s exit status (0: the target's schema is the source's).
#
# Environment: BENCH_SCALE (default 20), BENCH_RATE (default 200), BENCH_SOURCE_PG and
# BENCH_TARGET_PG (the clusters' major versions, default 15; 14–18 from scripts/pgservers.sh: a
# major-version upgrade, docs/upgrade.md), BENCH_PORT (source port, default 54431; the target uses
# the next one), BENCH_ROOT (default /tmp/pgconverge-bench-switchover), PGCONVERGE_KEEP=1, PGBIN.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ROOT=${BENCH_ROOT:-/tmp/pgconverge-bench-switchover}
BIN=$ROOT/bin/pgconverge
SCALE=${BENCH_SCALE:-20}
RATE=${BENCH_RATE:-200}
SRC_PORT=${BENCH_PORT:-54431}
TGT_PORT=$((SRC_PORT + 1))

DAEMON_PID=
PGBENCH_PID=
trap stop_on_exit EXIT

command -v bc >/dev/null || apt-get install -y bc >/dev/null
mkdir -p "$ROOT/bin"
go build -o "$BIN" ./cmd/pgconverge
PG_SERVER_VERSION=${BENCH_SOURCE_PG:-15} "$PGCLUSTER" start source "$SRC_PORT" "$ROOT" logical
PG_SERVER_VERSION=${BENCH_TARGET_PG:-15} "$PGCLUSTER" start target "$TGT_PORT" "$ROOT"
SRC=$("$PGCLUSTER" url source "$SRC_PORT")
TGT=$("$PGCLUSTER" url target "$TGT_PORT")

echo "== loading pgbench scale $SCALE into the source"
"$PGBIN/pgbench" -i -q -s "$SCALE" --foreign-keys "$SRC" >"$ROOT/pgbench-init.log" 2>&1
q "$SRC" "ALTER TABLE pgbench_history ADD COLUMN hid bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  ALTER COLUMN mtime SET DEFAULT now()"
q "$SRC" "ALTER TABLE pgbench_accounts ADD CONSTRAINT pgbench_accounts_abalance_check CHECK (abalance > -1000000000)"
q "$SRC" "CREATE INDEX pgbench_accounts_bid_idx ON pgbench_accounts (bid)"
q "$SRC" "CREATE ROLE app LOGIN"
q "$SRC" "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO app"

echo "== pgconverge run --copy-indexes: initial load and index build"
"$BIN" run --source "$SRC" --target "$TGT" --copy-indexes --log-format json >"$ROOT/run.log" 2>&1 &
DAEMON_PID=$!
start=$(now)
wait_for "$TGT" "select count(*) from pgconverge.tables where loaded_lsn is not null" 4
wait_for "$TGT" "select count(*) from pgconverge.target_indexes" 1
echo "loaded and indexed in $(since "$start" | xargs printf '%.1f') s"

echo "== pgbench as app at $RATE transactions/s, then the switchover while it writes"
"$PGBIN/pgbench" -n -R "$RATE" -T 600 -c 4 "${SRC/postgres@/app@}" >"$ROOT/pgbench.log" 2>&1 &
PGBENCH_PID=$!
sleep 20
kill -TERM "$DAEMON_PID"
wait "$DAEMON_PID" || true
DAEMON_PID=
start=$(now)
"$BIN" cutover --source "$SRC" --target "$TGT" --pause-writes app --format json >"$ROOT/cutover.json" 2>"$ROOT/cutover.log" ||
	{ tail -n 20 "$ROOT/cutover.log"; exit 1; }
cutover_s=$(since "$start")
wait "$PGBENCH_PID" || true
PGBENCH_PID=
pause=$(grep -o '"write_pause_seconds": *[0-9.]*' "$ROOT/cutover.json" | cut -d: -f2)
set +e
"$BIN" verify --schema --source "$SRC" --target "$TGT" >"$ROOT/verify-schema.log" 2>&1
schema_rc=$?
set -e
committed=$(q "$SRC" "select count(*) from pgbench_history")

echo "== summary"
printf 'scale %s, pgbench %s/s as app: %s transactions committed on the source\n' "$SCALE" "$RATE" "$committed"
printf 'cutover --pause-writes: %.1f s in all; writes paused %.1f s\n' "$cutover_s" "$pause"
printf 'verify --schema after it: exit %s\n' "$schema_rc"
echo "carried over at finalize:"
sed -n '/"carried": \[/,/\]/p' "$ROOT/cutover.json" | grep -v '[][]' | tr -d '",' | sed 's/^ */  /'
[ "$schema_rc" = 0 ] || { cat "$ROOT/verify-schema.log"; exit 1; }
