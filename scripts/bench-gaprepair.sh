#!/usr/bin/env bash
# bench-gaprepair.sh — what a coverage gap costs the daemon after a failover without a synced slot:
# `run --on-gap=repair` (compare at the new slot's snapshot, write the keys that differ) against
# `run --on-gap=backfill` (read and write every row of the table again), from the same state, in
# the same run on the same clusters.
#
# 1. starts private clusters `source` (127.0.0.1:54391, wal_level=logical) and `target` (:54392)
#    under /tmp/pgconverge-bench-gaprepair, loads pgbench at scale BENCH_SCALE (default 20:
#    2,000,000 rows in pgbench_accounts) into the source and creates two target databases,
#    gap_repair and gap_backfill; for each, `pgconverge run` with a slot and publication of that
#    name loads pgbench_accounts and streams until its coverage has no gap, and is stopped;
# 2. drops both slots (what a failover to a standby without synced slots leaves) and, in the gap,
#    updates BENCH_CHANGED (default 1% of the rows) random accounts on the source;
# 3. for each database, repair first: starts `pgconverge run --on-gap=MODE` and times it until
#    `pgconverge coverage --fail-on-gap` exits 0, stops it, and counts the rows it wrote: the delta
#    of n_tup_ins + n_tup_upd + n_tup_del of the target's pgbench_accounts (pg_stat_user_tables,
#    flushed when the daemon's sessions end); checks that the table equals the source (count, sum
#    of abalance, sum of aid × abalance);
# 4. prints both and the ratios backfill / repair.
#
# Environment: BENCH_SCALE (default 20), BENCH_CHANGED (rows updated in the gap, default 1% of the
# rows), BENCH_PORT (source port, default 54391; the target uses the next one), BENCH_ROOT (default
# /tmp/pgconverge-bench-gaprepair), PGCONVERGE_KEEP=1 (keep BENCH_ROOT), PGBIN.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ROOT=${BENCH_ROOT:-/tmp/pgconverge-bench-gaprepair}
BIN=$ROOT/bin/pgconverge
SCALE=${BENCH_SCALE:-20}
SRC_PORT=${BENCH_PORT:-54391}
TGT_PORT=$((SRC_PORT + 1))
TABLE=pgbench_accounts
N=$((SCALE * 100000))
CHANGED=${BENCH_CHANGED:-$((N / 100))}

die() {
	echo "bench-gaprepair: $*" >&2
	exit 1
}

DAEMON_PID=
trap stop_on_exit EXIT

command -v bc >/dev/null || apt-get install -y bc >/dev/null
command -v jq >/dev/null || apt-get install -y jq >/dev/null
mkdir -p "$ROOT/bin"
go build -o "$BIN" ./cmd/pgconverge
"$PGCLUSTER" start source "$SRC_PORT" "$ROOT" logical
"$PGCLUSTER" start target "$TGT_PORT" "$ROOT"
SRC=$("$PGCLUSTER" url source "$SRC_PORT")
TGT_ADMIN=$("$PGCLUSTER" url target "$TGT_PORT")
tgt() { echo "${TGT_ADMIN%/*}/$1"; }

# start_daemon DB [FLAGS...]: runs the daemon into database DB with the slot and publication DB,
# logging to $ROOT/DB.log.
start_daemon() {
	local db=$1
	shift
	"$BIN" run --source "$SRC" --target "$(tgt "$db")" --tables "public.$TABLE" --slot "$db" --publication "$db" \
		--log-format json "$@" >>"$ROOT/$db.log" 2>&1 &
	DAEMON_PID=$!
}
stop_daemon() {
	kill -TERM "$DAEMON_PID"
	wait "$DAEMON_PID" || true
	DAEMON_PID=
}
# covered DB: whether coverage exits 0 and reports the table covered (a target whose daemon has not
# registered the table yet has nothing to cover, and exits 0 too).
covered() {
	"$BIN" coverage --source "$SRC" --target "$(tgt "$1")" --slot "$1" --fail-on-gap --format json 2>/dev/null |
		jq -e --arg t "public.$TABLE" '[(.tables // [])[] | select(.table == $t and .status == "covered")] | length == 1' >/dev/null
}
# wait_covered DB: polls coverage every 0.1 s until it exits 0 (at most 30 min).
wait_covered() {
	for _ in $(seq 18000); do
		covered "$1" && return 0
		kill -0 "$DAEMON_PID" 2>/dev/null || { tail -n 20 "$ROOT/$1.log" >&2; die "pgconverge run into $1 exited"; }
		sleep 0.1
	done
	die "$1: $TABLE is not covered after 30 min"
}
# written DB: the rows written into the target's table so far, as its statistics count them.
written() {
	q "$(tgt "$1")" "SELECT n_tup_ins + n_tup_upd + n_tup_del FROM pg_stat_user_tables WHERE relid = 'public.$TABLE'::regclass"
}
# settled DB: written DB once two reads 0.5 s apart agree (the daemon's sessions flushed their
# statistics as they ended).
settled() {
	local a b
	b=$(written "$1")
	for _ in $(seq 60); do
		sleep 0.5
		a=$b b=$(written "$1")
		[ "$a" = "$b" ] && break
	done
	echo "$b"
}
summary() { q "$1" "SELECT count(*), sum(abalance::int8), sum(aid::int8 * abalance) FROM $TABLE $2"; }

echo "== pgbench -i -s $SCALE on the source ($N rows in $TABLE); two target databases loaded by pgconverge run"
PGOPTIONS='-c client_min_messages=warning' "$PGBIN/pgbench" -i -s "$SCALE" -q "$SRC" 2>"$ROOT/pgbench.log"
for db in gap_repair gap_backfill; do
	q "$TGT_ADMIN" "CREATE DATABASE $db"
	start_daemon "$db"
	wait_covered "$db"
	stop_daemon
done

echo "== slots dropped (a failover without synced slots); $CHANGED random accounts updated in the gap"
for db in gap_repair gap_backfill; do
	wait_for "$SRC" "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '$db' AND NOT active" 1
	q "$SRC" "SELECT pg_drop_replication_slot('$db')" >/dev/null
done
q "$SRC" "SELECT setseed(0.32)" >/dev/null
q "$SRC" "UPDATE $TABLE SET abalance = abalance + 1 WHERE aid IN (SELECT aid FROM $TABLE ORDER BY random() LIMIT $CHANGED)"
WANT=$(summary "$SRC" "")

declare -A SECS ROWS
for mode in repair backfill; do
	db=gap_$mode
	before=$(settled "$db")
	covered "$db" && die "$db has no coverage gap after its slot was dropped"
	t0=$(now)
	start_daemon "$db" --on-gap="$mode"
	wait_covered "$db"
	SECS[$mode]=$(since "$t0")
	stop_daemon
	ROWS[$mode]=$(($(settled "$db") - before))
	got=$(summary "$(tgt "$db")" "WHERE NOT _cdc_deleted")
	[ "$got" = "$WANT" ] || die "$db: $TABLE differs from the source after --on-gap=$mode: $got, want $WANT"
	printf '   --on-gap=%-8s covered after %7.2f s, %8d rows written\n' "$mode" "${SECS[$mode]}" "${ROWS[$mode]}"
done
jq -c 'select(.msg == "gap repaired by comparison") | {rows_compared, keys_differing, rows_written, tombstones, seconds}' "$ROOT/gap_repair.log"
jq -c 'select(.msg == "backfill completed" and .trigger == null) | {rows, applied, suppressed, tombstoned_absent, seconds}' "$ROOT/gap_backfill.log" | tail -n 1

echo
echo "== results ($N rows, $CHANGED changed in the gap; both sides on this machine)"
printf '   time until coverage exits 0   backfill %.2f s, repair %.2f s: repair %.1fx faster\n' \
	"${SECS[backfill]}" "${SECS[repair]}" "$(echo "${SECS[backfill]} / ${SECS[repair]}" | bc -l)"
printf '   rows written                  backfill %d, repair %d: repair writes %.1fx fewer\n' \
	"${ROWS[backfill]}" "${ROWS[repair]}" "$(echo "${ROWS[backfill]} / ${ROWS[repair]}" | bc -l)"
