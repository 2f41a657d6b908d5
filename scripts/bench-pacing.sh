#!/usr/bin/env bash
# bench-pacing.sh — what a rate-limited backfill costs an application on the source, and how a
# paused stream catches up.
#
# 1. starts private clusters `source` (127.0.0.1:54441, wal_level=logical) and `target` (:54442)
#    under /tmp/pgconverge-bench-pacing; loads pgbench scale 10 and a table `big` of BENCH_ROWS rows
#    (default 2,000,000, about 120 bytes each) into the source; starts `pgconverge run` for the
#    pgbench tables;
# 2. runs pgbench on the source at a fixed rate (BENCH_RATE, default 200 transactions/s, 4
#    clients) three times, logging every transaction's latency: alone for 30 s (the baseline);
#    during `pgconverge backfill --table public.big --max-rows-per-second BENCH_LIMIT` (default
#    20,000); during a raw `COPY big TO STDOUT` piped to /dev/null at the same rate (pv -L: what
#    reading those rows costs the source, with no target and no pgconverge); during the same
#    backfill without a limit. It prints each backfill's rate, its ratio to the limit, and
#    pgbench's p99 latency in each phase as a ratio to the baseline's and to the raw COPY's;
# 3. pauses the daemon's stream (`pgconverge pause --what stream`) for BENCH_PAUSE seconds
#    (default 60) with pgbench still writing, resumes it, and prints how long the stream took to
#    catch up (the target's progress reaching the source's position at the resume) and verify's
#    exit status afterwards over the streamed tables (0: nothing lost; pgbench_history has no key
#    and is kept by snapshots only).
#
# Environment: BENCH_ROWS, BENCH_RATE, BENCH_LIMIT, BENCH_PAUSE, BENCH_PORT (source port, default
# 54441; the target uses the next one), BENCH_ROOT (default /tmp/pgconverge-bench-pacing),
# PGCONVERGE_KEEP=1, PGBIN.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ROOT=${BENCH_ROOT:-/tmp/pgconverge-bench-pacing}
BIN=$ROOT/bin/pgconverge
ROWS=${BENCH_ROWS:-2000000}
RATE=${BENCH_RATE:-200}
LIMIT=${BENCH_LIMIT:-20000}
PAUSE=${BENCH_PAUSE:-60}
SRC_PORT=${BENCH_PORT:-54441}
TGT_PORT=$((SRC_PORT + 1))

DAEMON_PID=
PGBENCH_PID=
trap stop_on_exit EXIT

command -v bc >/dev/null || apt-get install -y bc >/dev/null
command -v pv >/dev/null || apt-get install -y pv >/dev/null
mkdir -p "$ROOT/bin" "$ROOT/logs"
go build -o "$BIN" ./cmd/pgconverge
"$PGCLUSTER" start source "$SRC_PORT" "$ROOT" logical
"$PGCLUSTER" start target "$TGT_PORT" "$ROOT"
SRC=$("$PGCLUSTER" url source "$SRC_PORT")
TGT=$("$PGCLUSTER" url target "$TGT_PORT")

echo "== loading pgbench scale 10 and $ROWS rows of public.big into the source"
"$PGBIN/pgbench" -i -q -s 10 "$SRC" >"$ROOT/pgbench-init.log" 2>&1
q "$SRC" "create table big (id bigint primary key, payload text, n int)"
q "$SRC" "insert into big select g, md5(g::text) || md5((g * 7)::text) || md5((g * 13)::text), g % 1000 from generate_series(1, $ROWS) g"
q "$SRC" "vacuum analyze big"

"$BIN" run --source "$SRC" --target "$TGT" --tables 'public.pgbench_*' --log-format json >"$ROOT/run.log" 2>&1 &
DAEMON_PID=$!
wait_for "$TGT" "select count(*) from pgconverge.tables where loaded_lsn is not null" 4

# pgbench_for SECONDS NAME: pgbench at RATE for SECONDS, each transaction's latency logged under
# logs/NAME.* (run in the background, the job is pgbench itself: `exec`).
pgbench_for() {
	exec "$PGBIN/pgbench" -n -R "$RATE" -T "$1" -c 4 -j 2 -l --log-prefix="$ROOT/logs/$2" "$SRC" >"$ROOT/pgbench-$2.log" 2>&1
}
# p99 NAME: the 99th percentile of the logged latencies in ms (the log's third field, µs).
p99() {
	cat "$ROOT/logs/$1".* | awk '{print $3}' | sort -n | awk '{a[NR]=$1} END {printf "%.2f", a[int(NR*0.99)]/1000}'
}
# backfill_with NAME ARGS...: a backfill of big (read again whole) with pgbench alongside for as
# long as it runs (stopped by SIGTERM at its end: the last few logged transactions of each pgbench
# thread may be lost), its seconds in backfill-NAME.seconds.
backfill_with() {
	local name=$1
	shift
	pgbench_for 600 "$name" &
	PGBENCH_PID=$!
	local start
	start=$(now)
	"$BIN" backfill --source "$SRC" --target "$TGT" --table public.big --resume=false "$@" --log-format json >"$ROOT/backfill-$name.out" 2>"$ROOT/backfill-$name.log"
	since "$start" >"$ROOT/backfill-$name.seconds"
	kill -TERM "$PGBENCH_PID" 2>/dev/null || true
	wait "$PGBENCH_PID" 2>/dev/null || true
	PGBENCH_PID=
}

echo "== pgbench at $RATE/s alone for 30 s"
(pgbench_for 30 baseline)
base=$(p99 baseline)
echo "== backfill of $ROWS rows at --max-rows-per-second $LIMIT, pgbench alongside"
backfill_with limited --max-rows-per-second "$LIMIT"
limited_s=$(cat "$ROOT/backfill-limited.seconds")
limited_p99=$(p99 limited)
echo "== the baseline: the table's rows read by a raw COPY to /dev/null at the same rate (pv -L), pgbench alongside"
copy_bytes=$(q "$SRC" "select sum(octet_length(b::text) - 1) from big b")
pipe_rate=$(echo "$copy_bytes * $LIMIT / $ROWS" | bc)
pgbench_for 600 rawcopy &
PGBENCH_PID=$!
start=$(now)
"$PGBIN/psql" -X -q -d "$SRC" -c "copy big to stdout" | pv -q -L "$pipe_rate" >/dev/null
rawcopy_s=$(since "$start")
kill -TERM "$PGBENCH_PID" 2>/dev/null || true
wait "$PGBENCH_PID" 2>/dev/null || true
PGBENCH_PID=
rawcopy_p99=$(p99 rawcopy)
echo "== the same backfill without a limit, pgbench alongside"
backfill_with unlimited
unlimited_s=$(cat "$ROOT/backfill-unlimited.seconds")
unlimited_p99=$(p99 unlimited)

echo "== the stream paused for $PAUSE s under pgbench, then resumed"
pgbench_for $((PAUSE + 30)) paused &
PGBENCH_PID=$!
"$BIN" pause --target "$TGT" --what stream >/dev/null
sleep "$PAUSE"
resume_lsn=$(q "$SRC" "select pg_current_wal_lsn()")
held=$(q "$SRC" "select pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)) from pg_replication_slots where slot_name = 'pgconverge'")
"$BIN" resume --target "$TGT" --what stream >/dev/null
start=$(now)
wait_for "$TGT" "select applied_lsn >= '$resume_lsn' from pgconverge.progress where slot = 'pgconverge'" t
catchup_s=$(since "$start")
wait "$PGBENCH_PID" || true
PGBENCH_PID=
set +e
"$BIN" verify --source "$SRC" --target "$TGT" --table public.pgbench_accounts,public.pgbench_branches,public.pgbench_tellers >"$ROOT/verify.log" 2>&1
verify_rc=$?
set -e

echo "== summary"
printf 'pgbench %s/s, 4 clients; p99 latency alone: %s ms\n' "$RATE" "$base"
printf 'backfill of %s rows at --max-rows-per-second %s: %.1f s, %.0f rows/s = %.3fx the limit; pgbench p99 %s ms = %.2fx alone\n' \
	"$ROWS" "$LIMIT" "$limited_s" "$(echo "$ROWS / $limited_s" | bc -l)" "$(echo "$ROWS / $limited_s / $LIMIT" | bc -l)" "$limited_p99" "$(echo "$limited_p99 / $base" | bc -l)"
printf 'raw COPY of the same rows at the same rate: %.1f s; pgbench p99 %s ms = %.2fx alone; the backfill'"'"'s p99 = %.2fx the raw COPY'"'"'s\n' \
	"$rawcopy_s" "$rawcopy_p99" "$(echo "$rawcopy_p99 / $base" | bc -l)" "$(echo "$limited_p99 / $rawcopy_p99" | bc -l)"
printf 'backfill without a limit: %.1f s, %.0f rows/s; pgbench p99 %s ms = %.2fx alone\n' \
	"$unlimited_s" "$(echo "$ROWS / $unlimited_s" | bc -l)" "$unlimited_p99" "$(echo "$unlimited_p99 / $base" | bc -l)"
printf 'stream paused %s s (the slot held %s at the resume): caught up %.1f s after the resume; verify exit %s\n' \
	"$PAUSE" "$held" "$catchup_s" "$verify_rc"
[ "$verify_rc" = 0 ] || { tail -n 20 "$ROOT/verify.log"; exit 1; }
