#!/usr/bin/env bash
# bench-keyless.sh — what a table without a key (REPLICA IDENTITY FULL, replicated by whole rows)
# costs the stream, as a ratio to the same table with a primary key, in the same run.
#
# 1. starts private clusters `source` (127.0.0.1:54391, wal_level=logical) and `target` (:54392)
#    under /tmp/pgconverge-bench-keyless; creates kd (id int primary key, v int) and kl (id int,
#    v int, REPLICA IDENTITY FULL), BENCH_ROWS rows each (default 200000);
# 2. `pgconverge run` loads both and streams;
# 3. three rounds, each: one source transaction per table that inserts, then one that updates,
#    then one that deletes BENCH_ROWS/10 rows; each timed from its commit until the target's live
#    rows show it; the keyed table first in odd rounds, the keyless one first in even rounds;
# 4. prints the median seconds per phase for both tables and the ratio keyless / keyed, and
#    checks that both tables equal the source at the end.
#
# Environment: BENCH_ROWS (default 200000), PGCONVERGE_BIN (use this binary instead of building
# ./cmd/pgconverge, e.g. one built from an older commit for an A/B of two runs), BENCH_LOG_MS (log
# the target's statements that take at least this many milliseconds, in target.log: where the
# apply's time goes), PGCONVERGE_KEEP=1 (keep the clusters' folder, logs included), PGBIN.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ROOT=/tmp/pgconverge-bench-keyless
BIN=$ROOT/bin/pgconverge
ROWS=${BENCH_ROWS:-200000}
STEP=$((ROWS / 10))
DAEMON_PID=

trap stop_on_exit EXIT

# timed TABLE SQL CHECK: runs SQL on TABLE at the source, then waits until CHECK (a count over the
# table's rows) gives the same on the target's live rows; prints the seconds.
timed() {
	local want t0
	q "$SRC" "$2"
	t0=$(now)
	want=$(q "$SRC" "SELECT $3 FROM $1")
	wait_for "$TGT" "SELECT $3 FROM $1 WHERE NOT _cdc_deleted" "$want"
	since "$t0"
}

command -v bc >/dev/null || apt-get install -y bc >/dev/null
mkdir -p "$ROOT/bin"
if [ -n "${PGCONVERGE_BIN:-}" ]; then
	BIN=$PGCONVERGE_BIN
	[ -x "$BIN" ] || { echo "PGCONVERGE_BIN=$BIN is not an executable" >&2; exit 1; }
else
	go build -o "$BIN" ./cmd/pgconverge
fi
"$PGCLUSTER" start source 54391 "$ROOT" logical
"$PGCLUSTER" start target 54392 "$ROOT"
SRC=$("$PGCLUSTER" url source 54391)
TGT=$("$PGCLUSTER" url target 54392)
if [ -n "${BENCH_LOG_MS:-}" ]; then
	q "$TGT" "ALTER SYSTEM SET log_min_duration_statement = ${BENCH_LOG_MS}"
	q "$TGT" "SELECT pg_reload_conf()" >/dev/null
fi
q "$SRC" "CREATE TABLE kd (id int PRIMARY KEY, v int)"
q "$SRC" "CREATE TABLE kl (id int, v int)"
q "$SRC" "ALTER TABLE kl REPLICA IDENTITY FULL"
for t in kd kl; do q "$SRC" "INSERT INTO $t SELECT g, g FROM generate_series(1, $ROWS) g"; done
"$BIN" run --source "$SRC" --target "$TGT" --tables public.kd,public.kl --log-level warn >"$ROOT/run.log" 2>&1 &
DAEMON_PID=$!
for t in kd kl; do wait_for "$TGT" "SELECT count(*) FROM $t WHERE NOT _cdc_deleted" "$ROWS"; done
echo "loaded $ROWS rows into kd and kl; $STEP rows per transaction"

declare -A secs
for round in 1 2 3; do
	order="kd kl"
	((round % 2 == 1)) || order="kl kd"
	base=$((ROWS + round * STEP))
	for t in $order; do
		secs[$t.insert]+=" $(timed $t "INSERT INTO $t SELECT g, g FROM generate_series($base + 1, $base + $STEP) g" "count(*)")"
		secs[$t.update]+=" $(timed $t "UPDATE $t SET v = v + 1 WHERE id % 10 = $round" "sum(v::int8)")"
		secs[$t.delete]+=" $(timed $t "DELETE FROM $t WHERE id % 10 = $((round + 3))" "count(*)")"
	done
done

printf '%-8s %12s %12s %8s\n' phase keyed_s keyless_s ratio
for phase in insert update delete; do
	# shellcheck disable=SC2086 # word splitting of the lists is intended
	kd=$(median ${secs[kd.$phase]}) kl=$(median ${secs[kl.$phase]})
	printf '%-8s %12.3f %12.3f %8.2f\n' "$phase" "$kd" "$kl" "$(echo "$kl / $kd" | bc -l)"
done
for t in kd kl; do
	want=$(q "$SRC" "SELECT count(*) || ' ' || sum(v::int8) FROM $t")
	got=$(q "$TGT" "SELECT count(*) || ' ' || sum(v::int8) FROM $t WHERE NOT _cdc_deleted")
	[ "$want" = "$got" ] || { echo "$t differs: source $want, target $got" >&2; exit 1; }
done
echo "both tables equal the source"
