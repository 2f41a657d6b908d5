#!/usr/bin/env bash
# bench-streaming.sh — a large transaction through three consumers, each alone on the same
# clusters in one run: pgconverge with --stream-in-progress (the source streams the transaction
# before its commit, pgconverge stages it on the target), pgconverge with
# --stream-in-progress=false (protocol 1: the source holds the transaction, spilling past
# logical_decoding_work_mem to its disk, and sends it at its commit) and native logical replication
# (CREATE SUBSCRIPTION … WITH (streaming = on), the baseline).
#
# 1. starts private clusters `source` (127.0.0.1:54421, wal_level=logical, logical_decoding_work_mem
#    at its default 64 MB) and `target` (:54422) under /tmp/pgconverge-bench-streaming; creates
#    `big (id int primary key, v text, pad text)` and `small (id bigserial primary key, at
#    timestamptz)` on the source, and a target database per consumer;
# 2. per consumer: starts it (pgconverge run with its own slot, or the subscription) and waits until
#    it streams; adds to the target's `small` a column `seen timestamptz default clock_timestamp()`
#    (pgconverge keeps a target column the source lacks, and native apply fills its default); resets
#    the slot's statistics; then, while a background loop commits a small transaction every 50 ms,
#    runs one transaction inserting BENCH_ROWS rows (default 2,000,000) into `big`, and then one
#    updating every row of it; after each COMMIT returns it times until the source's walsender has
#    sent the whole transaction (pg_stat_replication.sent_lsn at the source's WAL position after the
#    COMMIT: "delivered", what the consumer cannot speed up) and until the transaction's last row
#    is visible on the target (pgconverge applies a large transaction's parts in order, native in one
#    commit); then reads the slot's spill_bytes and stream_bytes (pg_stat_replication_slots), the
#    small transactions' latency from source commit to target row (p50, p99: seen - at), and
#    pgconverge's peak RSS (VmHWM);
# 3. prints a table and the ratios: pgconverge streaming / native and / pgconverge protocol 1, of
#    the time to visible and of its part after delivery.
#
# Environment: BENCH_ROWS (default 2000000), BENCH_PORT (source port, default 54421; the target uses
# the next one), BENCH_ROOT (default /tmp/pgconverge-bench-streaming), PGCONVERGE_KEEP=1, PGBIN.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ROOT=${BENCH_ROOT:-/tmp/pgconverge-bench-streaming}
BIN=$ROOT/bin/pgconverge
ROWS=${BENCH_ROWS:-2000000}
SRC_PORT=${BENCH_PORT:-54421}
TGT_PORT=$((SRC_PORT + 1))

die() {
	echo "bench-streaming: $*" >&2
	exit 1
}

DAEMON_PID=
SMALL_PID=
cleanup() {
	[ -n "$SMALL_PID" ] && kill "$SMALL_PID" 2>/dev/null
	q "$(tgt native)" "DROP SUBSCRIPTION IF EXISTS bench_native" >/dev/null 2>&1 || true
	stop_on_exit
}
trap cleanup EXIT

command -v bc >/dev/null || apt-get install -y bc >/dev/null
mkdir -p "$ROOT/bin"
go build -o "$BIN" ./cmd/pgconverge
"$PGCLUSTER" start source "$SRC_PORT" "$ROOT" logical
"$PGCLUSTER" start target "$TGT_PORT" "$ROOT"
SRC=$("$PGCLUSTER" url source "$SRC_PORT")
TGT_ADMIN=$("$PGCLUSTER" url target "$TGT_PORT")
tgt() { echo "${TGT_ADMIN%/*}/$1"; }

SCHEMA="CREATE TABLE big (id int PRIMARY KEY, v text, pad text); CREATE TABLE small (id bigserial PRIMARY KEY, at timestamptz)"
q "$SRC" "$SCHEMA"
q "$SRC" "CREATE PUBLICATION bench_native FOR TABLE big, small"
for db in stream proto1 native; do q "$TGT_ADMIN" "CREATE DATABASE $db"; done

# small_loop: commits a small transaction every 50 ms until killed.
small_loop() {
	while true; do
		q "$SRC" "INSERT INTO small (at) VALUES (clock_timestamp())" >/dev/null
		sleep 0.05
	done
}

# visible DB SQL: polls every 0.05 s until SQL is true on the target database DB (at most 30 min).
visible() {
	local start=$SECONDS
	until [ "$(q "$(tgt "$1")" "$2" 2>/dev/null)" = t ]; do
		((SECONDS - start < 1800)) || die "$1: not visible after 30 min: $2"
		if [ -n "$DAEMON_PID" ] && ! kill -0 "$DAEMON_PID" 2>/dev/null; then
			tail -n 20 "$ROOT/$1.log" >&2
			die "pgconverge run into $1 exited"
		fi
		sleep 0.05
	done
}

# delivered_then_visible NAME SQL: polls every 0.05 s until the walsender of slot $SLOT has sent
# the source's WAL up to its position now, and until SQL is true on the target database NAME;
# prints the seconds each took.
delivered_then_visible() {
	local lsn t0 delivered=
	lsn=$(q "$SRC" "SELECT pg_current_wal_lsn()")
	t0=$(now)
	while [ -z "$delivered" ]; do
		if [ "$(q "$SRC" "SELECT r.sent_lsn >= '$lsn' FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = '$SLOT'")" = t ]; then
			delivered=$(since "$t0")
		else
			sleep 0.05
		fi
	done
	visible "$1" "$2"
	echo "$delivered $(since "$t0")"
}

# start_consumer NAME: starts the consumer NAME and waits until it streams, with `seen` added.
start_consumer() {
	case $1 in
	native)
		q "$(tgt native)" "$SCHEMA; ALTER TABLE small ADD COLUMN seen timestamptz DEFAULT clock_timestamp()"
		q "$(tgt native)" "CREATE SUBSCRIPTION bench_native CONNECTION '$SRC' PUBLICATION bench_native WITH (streaming = on)"
		SLOT=bench_native
		;;
	*)
		local flag=true
		[ "$1" = proto1 ] && flag=false
		"$BIN" run --source "$SRC" --target "$(tgt "$1")" --tables public.big,public.small --slot "bench_$1" --publication "bench_$1" \
			--stream-in-progress="$flag" --log-format json >>"$ROOT/$1.log" 2>&1 &
		DAEMON_PID=$!
		SLOT=bench_$1
		visible "$1" "SELECT to_regclass('public.small') IS NOT NULL"
		q "$(tgt "$1")" "ALTER TABLE small ADD COLUMN seen timestamptz DEFAULT clock_timestamp()"
		;;
	esac
	wait_for "$SRC" "SELECT count(*) FROM pg_stat_replication r JOIN pg_replication_slots s ON s.active_pid = r.pid WHERE s.slot_name = '$SLOT' AND r.state = 'streaming'" 1
	q "$SRC" "SELECT pg_stat_reset_replication_slot('$SLOT')" >/dev/null
}

stop_consumer() {
	case $1 in
	native)
		q "$(tgt native)" "DROP SUBSCRIPTION bench_native"
		;;
	*)
		kill -TERM "$DAEMON_PID"
		wait "$DAEMON_PID" || true
		DAEMON_PID=
		q "$SRC" "SELECT pg_drop_replication_slot('bench_$1')" >/dev/null
		q "$SRC" "DROP PUBLICATION bench_$1" >/dev/null
		;;
	esac
}

declare -A INS UPD INS_D UPD_D SPILL STREAMED P50 P99 RSS
for c in stream proto1 native; do
	echo "== $c"
	q "$SRC" "TRUNCATE big, small"
	start_consumer "$c"
	small_loop &
	SMALL_PID=$!
	q "$SRC" "INSERT INTO big SELECT g, 'inserted', repeat('x', 100) FROM generate_series(1, $ROWS) g"
	read -r INS_D[$c] INS[$c] < <(delivered_then_visible "$c" "SELECT EXISTS (SELECT 1 FROM big WHERE id = $ROWS)")
	q "$SRC" "UPDATE big SET v = 'updated'"
	read -r UPD_D[$c] UPD[$c] < <(delivered_then_visible "$c" "SELECT EXISTS (SELECT 1 FROM big WHERE id = $ROWS AND v = 'updated')")
	kill "$SMALL_PID"
	wait "$SMALL_PID" 2>/dev/null || true
	SMALL_PID=
	last=$(q "$SRC" "SELECT max(id) FROM small")
	visible "$c" "SELECT EXISTS (SELECT 1 FROM small WHERE id = $last)"
	read -r SPILL[$c] STREAMED[$c] < <(q "$SRC" "SELECT spill_bytes, stream_bytes FROM pg_stat_replication_slots WHERE slot_name = '$SLOT'" | tr '|' ' ')
	read -r P50[$c] P99[$c] < <(q "$(tgt "$c")" "SELECT round(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM seen - at))::numeric, 3), round(percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM seen - at))::numeric, 3) FROM small" | tr '|' ' ')
	RSS[$c]=-
	[ -n "$DAEMON_PID" ] && RSS[$c]=$(awk '/VmHWM/ {printf "%.0f MiB", $2 / 1024}' "/proc/$DAEMON_PID/status")
	printf '   insert delivered after %.2f s, visible after %7.2f s; update %.2f s, %7.2f s; spill_bytes %s, stream_bytes %s; small txns p50 %s s, p99 %s s; peak RSS %s\n' \
		"${INS_D[$c]}" "${INS[$c]}" "${UPD_D[$c]}" "${UPD[$c]}" "${SPILL[$c]}" "${STREAMED[$c]}" "${P50[$c]}" "${P99[$c]}" "${RSS[$c]}"
	stop_consumer "$c"
done

echo
echo "== results ($ROWS rows in one transaction, then one update of them; each consumer alone; seconds from the source's COMMIT to the walsender's last byte (delivered) and to the last row visible)"
printf '   %-8s %11s %10s %11s %10s %14s %14s %10s %10s %10s\n' consumer insert_dlvd insert_vis update_dlvd update_vis spill_bytes stream_bytes small_p50 small_p99 peak_rss
for c in stream proto1 native; do
	printf '   %-8s %11.2f %10.2f %11.2f %10.2f %14s %14s %10s %10s %10s\n' "$c" "${INS_D[$c]}" "${INS[$c]}" "${UPD_D[$c]}" "${UPD[$c]}" "${SPILL[$c]}" "${STREAMED[$c]}" "${P50[$c]}" "${P99[$c]}" "${RSS[$c]}"
done
printf '   pgconverge streaming / native: insert %.2fx, update %.2fx (goal: at most 0.5x)\n' \
	"$(echo "${INS[stream]} / ${INS[native]}" | bc -l)" "$(echo "${UPD[stream]} / ${UPD[native]}" | bc -l)"
printf '   after delivery, pgconverge streaming / native: insert %.2fx, update %.2fx\n' \
	"$(echo "(${INS[stream]} - ${INS_D[stream]}) / (${INS[native]} - ${INS_D[native]})" | bc -l)" \
	"$(echo "(${UPD[stream]} - ${UPD_D[stream]}) / (${UPD[native]} - ${UPD_D[native]})" | bc -l)"
printf '   pgconverge streaming / protocol 1: insert %.2fx, update %.2fx\n' \
	"$(echo "${INS[stream]} / ${INS[proto1]}" | bc -l)" "$(echo "${UPD[stream]} / ${UPD[proto1]}" | bc -l)"
