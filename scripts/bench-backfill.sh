#!/usr/bin/env bash
# bench-backfill.sh — how fast `pgconverge backfill` copies a table into an empty target, as ratios
# to a raw COPY pipe and to PostgreSQL's own logical replication initial sync, all measured in the
# same run on the same clusters; and pgconverge's peak RSS at two table sizes.
#
# 1. starts private clusters `source` (127.0.0.1:54371, wal_level=logical) and `target` (:54372)
#    under /tmp/pgconverge-bench-backfill; loads pgbench at scale BENCH_SCALE (default 20, i.e.
#    pgbench_accounts holds 100,000 rows per scale unit: 2,000,000) into the source;
# 2. each method copies pgbench_accounts into its own new, empty target database, dropped
#    afterwards; both clusters are CHECKPOINTed just before each; times are wall-clock:
#      raw pipe     table created from `pg_dump -s` (with its primary key), then
#                   `psql -c 'COPY … TO STDOUT' | psql -c 'COPY … FROM STDIN'` (text format);
#      native sync  same table; CREATE SUBSCRIPTION (copy_data) to a publication of the table,
#                   timed until its pg_subscription_rel state is 's' or 'r' (polled every 0.1 s);
#      pgconverge   `pgconverge backfill --workers 1`, then `--workers 2`; pgconverge creates the
#                   target table; the exit code and the target's row count are checked, the peak
#                   RSS comes from /usr/bin/time;
# 3. re-initializes pgbench at twice the scale and runs `--workers 2` again, to show that the peak
#    RSS does not grow with the table (BENCH_SKIP_DOUBLE=1 skips this);
# 4. prints rows/s for each, the ratios to the raw pipe and to native sync, and the peak RSS.
# Targets: pgconverge ≥ 0.8× the raw pipe, ≥ 1.0× native initial sync, peak RSS < 300 MB at any size.
#
# Environment: BENCH_SCALE (default 20), BENCH_CHUNK_ROWS (--chunk-rows, default 250000, the default),
# BENCH_SKIP_DOUBLE=1, BENCH_PORT (source port, default 54371; the target uses the next one),
# PGCONVERGE_KEEP=1 (keep /tmp/pgconverge-bench-backfill), PGBIN.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ROOT=/tmp/pgconverge-bench-backfill
BIN=$ROOT/bin/pgconverge
SCALE=${BENCH_SCALE:-20}
CHUNK=${BENCH_CHUNK_ROWS:-250000}
SRC_PORT=${BENCH_PORT:-54371}
TGT_PORT=$((SRC_PORT + 1))
TABLE=pgbench_accounts


trap stop_on_exit EXIT

die() {
	echo "bench-backfill: $*" >&2
	exit 1
}

# db_url NAME: the URL of database NAME on the target cluster.
db_url() { echo "${TGT_ADMIN/\/postgres\?/\/$1?}"; }

# fresh_db NAME: a new, empty target database NAME; with a second argument `schema`, it gets the
# source's definition of the table (columns, primary key) from pg_dump.
fresh_db() {
	q "$TGT_ADMIN" "DROP DATABASE IF EXISTS $1 WITH (FORCE)"
	q "$TGT_ADMIN" "CREATE DATABASE $1"
	if [ "${2:-}" = schema ]; then
		"$PGBIN/pg_dump" -s -t "$TABLE" "$SRC" | "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -d "$(db_url "$1")" >/dev/null
	fi
}
drop_db() { q "$TGT_ADMIN" "DROP DATABASE $1 WITH (FORCE)"; }
checkpoint() {
	q "$SRC" CHECKPOINT
	q "$TGT_ADMIN" CHECKPOINT
}

# check_rows DB EXPECTED [WHERE]: fail unless the target table in DB holds EXPECTED rows.
check_rows() {
	local n
	n=$(q "$(db_url "$1")" "SELECT count(*) FROM public.$TABLE ${3:+WHERE $3}")
	[ "$n" = "$2" ] || die "$1: the target holds $n rows of $TABLE, expected $2"
}

# Results, one entry per measured method: label, rows, seconds, peak RSS in KB ('' if not measured).
LABELS=() ROWS=() SECS=() RSS=()
record() {
	LABELS+=("$1") ROWS+=("$2") SECS+=("$3") RSS+=("${4:-}")
	printf '   %s rows in %.2f s\n' "$2" "$3"
}

# conv DB WORKERS ROWS LABEL: pgconverge backfill into the new, empty database DB; checks the exit
# code and the row count, records the time and the peak RSS.
conv() {
	local db=$1 url secs rc=0
	fresh_db "$db"
	url=$(db_url "$db")
	checkpoint
	local t0
	t0=$(now)
	/usr/bin/time -f %M -o "$ROOT/$db.rss" "$BIN" backfill --source "$SRC" --target "$url" \
		--table "public.$TABLE" --workers "$2" --chunk-rows "$CHUNK" --log-format json \
		>"$ROOT/$db.out" 2>"$ROOT/$db.log" || rc=$?
	secs=$(since "$t0")
	if [ "$rc" -ne 0 ]; then
		cat "$ROOT/$db.out" >&2
		tail -n 20 "$ROOT/$db.log" >&2
		die "pgconverge backfill --workers $2 exited with status $rc (log: $ROOT/$db.log)"
	fi
	sed 's/^/   | /' "$ROOT/$db.out"
	check_rows "$db" "$3" "NOT _cdc_deleted"
	record "$4" "$3" "$secs" "$(tail -n 1 "$ROOT/$db.rss")"
	drop_db "$db"
}

command -v bc >/dev/null || apt-get install -y bc >/dev/null
[ -x /usr/bin/time ] || apt-get install -y time >/dev/null
mkdir -p "$ROOT/bin"
go build -o "$BIN" ./cmd/pgconverge
"$PGCLUSTER" start source "$SRC_PORT" "$ROOT" logical
"$PGCLUSTER" start target "$TGT_PORT" "$ROOT"
SRC=$("$PGCLUSTER" url source "$SRC_PORT")
TGT_ADMIN=$("$PGCLUSTER" url target "$TGT_PORT")

N=$((SCALE * 100000))
echo "== pgbench -i -s $SCALE on the source ($N rows in $TABLE)"
PGOPTIONS='-c client_min_messages=warning' "$PGBIN/pgbench" -i -s "$SCALE" -q "$SRC" 2>"$ROOT/pgbench.log"
echo "   $TABLE: $(q "$SRC" "SELECT pg_size_pretty(pg_total_relation_size('$TABLE'))") with its index"

echo "== raw pipe: psql COPY TO STDOUT | psql COPY FROM STDIN (text)"
fresh_db raw schema
checkpoint
t0=$(now)
"$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -d "$SRC" -c "COPY $TABLE TO STDOUT" |
	"$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -d "$(db_url raw)" -c "COPY $TABLE FROM STDIN"
secs=$(since "$t0")
check_rows raw "$N"
record "raw COPY pipe" "$N" "$secs"
drop_db raw

echo "== native logical replication: initial sync (CREATE SUBSCRIPTION … copy_data)"
fresh_db native schema
q "$SRC" "CREATE PUBLICATION bench_backfill FOR TABLE $TABLE"
checkpoint
t0=$(now)
q "$(db_url native)" "CREATE SUBSCRIPTION bench_backfill CONNECTION '$SRC' PUBLICATION bench_backfill WITH (copy_data = true)"
until [ "$(q "$(db_url native)" "SELECT srsubstate IN ('s', 'r') FROM pg_subscription_rel WHERE srrelid = 'public.$TABLE'::regclass")" = t ]; do
	(($(echo "$(since "$t0") < 600" | bc) == 1)) || die "native initial sync timed out"
	sleep 0.1
done
secs=$(since "$t0")
q "$(db_url native)" "DROP SUBSCRIPTION bench_backfill" # drops its slot on the source too
q "$SRC" "DROP PUBLICATION bench_backfill"
[ "$(q "$SRC" "SELECT count(*) FROM pg_replication_slots")" = 0 ] || die "replication slots left on the source"
check_rows native "$N"
record "native initial sync" "$N" "$secs"
drop_db native

echo "== pgconverge backfill --workers 1"
conv conv1 1 "$N" "pgconverge, 1 worker"
echo "== pgconverge backfill --workers 2"
conv conv2 2 "$N" "pgconverge, 2 workers"
CONV2_RSS=${RSS[-1]}

if [ "${BENCH_SKIP_DOUBLE:-}" != 1 ]; then
	echo "== pgbench -i -s $((2 * SCALE)) on the source ($((2 * N)) rows), pgconverge backfill --workers 2"
	PGOPTIONS='-c client_min_messages=warning' "$PGBIN/pgbench" -i -s "$((2 * SCALE))" -q "$SRC" 2>>"$ROOT/pgbench.log"
	conv conv2x 2 "$((2 * N))" "pgconverge, 2 workers, scale $((2 * SCALE))"
fi

# The table: rows/s of each method, and its ratios to the raw pipe and to native sync (only for
# the methods that copied the same table as those two, at scale SCALE).
rate() { echo "${ROWS[$1]} / ${SECS[$1]}" | bc -l; }
RAW_RATE=$(rate 0)
NATIVE_RATE=$(rate 1)
printf '\n%-34s %9s %8s %10s %7s %8s %9s\n' "method (scale $SCALE unless noted)" rows seconds rows/s "x raw" "x native" "peak RSS"
for i in "${!LABELS[@]}"; do
	r=$(rate "$i")
	if [ "${ROWS[$i]}" = "$N" ]; then
		xraw=$(printf '%.2f' "$(echo "$r / $RAW_RATE" | bc -l)")
		xnat=$(printf '%.2f' "$(echo "$r / $NATIVE_RATE" | bc -l)")
	else
		xraw=- xnat=-
	fi
	rss=-
	[ -z "${RSS[$i]}" ] || rss="$((RSS[i] / 1024)) MB"
	printf '%-34s %9s %8.2f %10.0f %7s %8s %9s\n' "${LABELS[$i]}" "${ROWS[$i]}" "${SECS[$i]}" "$r" "$xraw" "$xnat" "$rss"
done

# Targets, for the default --workers 2.
C2_RATE=$(rate 3)
verdict() { if (($(echo "$1" | bc -l) == 1)); then echo met; else echo MISSED; fi; }
MAX_RSS=$CONV2_RSS
[ "${BENCH_SKIP_DOUBLE:-}" = 1 ] || ((RSS[4] <= MAX_RSS)) || MAX_RSS=${RSS[4]}
printf '\ntargets (--workers 2): %.2fx raw pipe (>= 0.8: %s), %.2fx native sync (>= 1.0: %s), peak RSS %d MB (< 300 MB: %s)\n' \
	"$(echo "$C2_RATE / $RAW_RATE" | bc -l)" "$(verdict "$C2_RATE >= 0.8 * $RAW_RATE")" \
	"$(echo "$C2_RATE / $NATIVE_RATE" | bc -l)" "$(verdict "$C2_RATE >= $NATIVE_RATE")" \
	"$((MAX_RSS / 1024))" "$(verdict "$MAX_RSS < 300 * 1024")"
