#!/usr/bin/env bash
# bench-verify.sh — how fast `pgconverge verify` compares pgbench_accounts between the source and
# the target, as ratios to a naive comparison and to `SELECT count(*)` on both sides, all measured
# in the same run on the same clusters; and how few rows it fetches to find scattered differences.
#
# 1. starts private clusters `source` (127.0.0.1:54381, wal_level=logical) and `target` (:54382)
#    under /tmp/pgconverge-bench-verify, loads pgbench at scale BENCH_SCALE (default 20: 2,000,000
#    rows in pgbench_accounts) into the source, and runs `pgconverge run` for pgbench_accounts
#    until its coverage has no gap;
# 2. equal tables, BENCH_ROUNDS rounds (default 3), the three methods alternating within each:
#      count(*)   `SELECT count(*)` on both sides at once (the floor: no value is read);
#      naive      both sides' rows `COPY (SELECT … ORDER BY aid) TO STDOUT` at once into files,
#                 then `cmp` (fetch everything, compare on the client);
#      verify     `pgconverge verify --table public.pgbench_accounts` (every row hashed,
#                 the whole table as one checksum, as a first verify does); 0 found;
#      verify inc `pgconverge verify` again (incremental: the last verify found the table equal and
#                 no row changed since, so it counts rows and xmins and hashes nothing); 0 found,
#                 its one group skipped;
#      first change
#                 3 scattered source rows updated (the stream applies them), then `pgconverge
#                 verify`: the table's one group changed, so it hashes the table by key-hash
#                 groups (which the next verify can skip one by one); 0 found;
#      3 changed  3 more rows updated and applied, then `pgconverge verify`: 0 found, all but the
#                 changed rows' groups skipped;
# 3. 100 differences: 100 scattered target rows changed by hand; `verify` must find exactly 100;
#    prints its rows fetched as a share of the table's rows; then `verify --repair` and a last
#    `verify` that must find 0;
# 4. prints the medians and the ratios. Targets: verify of equal tables ≥ 5× faster than naive and
#    within 3× of count(*) (issue 31: the incremental verify; the full one is printed beside it);
#    with 100 differences, rows fetched < 1% of the table.
#
# Environment: BENCH_SCALE (default 20), BENCH_ROUNDS (default 3), BENCH_PORT (source port, default
# 54381; the target uses the next one), BENCH_ROOT (default /tmp/pgconverge-bench-verify),
# PGCONVERGE_KEEP=1 (keep BENCH_ROOT), PGBIN.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ROOT=${BENCH_ROOT:-/tmp/pgconverge-bench-verify}
BIN=$ROOT/bin/pgconverge
SCALE=${BENCH_SCALE:-20}
ROUNDS=${BENCH_ROUNDS:-3}
SRC_PORT=${BENCH_PORT:-54381}
TGT_PORT=$((SRC_PORT + 1))
TABLE=pgbench_accounts
COLS="aid, bid, abalance, filler"

die() {
	echo "bench-verify: $*" >&2
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
TGT=$("$PGCLUSTER" url target "$TGT_PORT")
N=$((SCALE * 100000))

echo "== pgbench -i -s $SCALE on the source ($N rows in $TABLE), pgconverge run"
PGOPTIONS='-c client_min_messages=warning' "$PGBIN/pgbench" -i -s "$SCALE" -q "$SRC" 2>"$ROOT/pgbench.log"
"$BIN" run --source "$SRC" --target "$TGT" --tables "public.$TABLE" --log-format json >"$ROOT/run.log" 2>&1 &
DAEMON_PID=$!
for _ in $(seq 600); do
	"$BIN" coverage --source "$SRC" --target "$TGT" --fail-on-gap >/dev/null 2>&1 && break
	kill -0 "$DAEMON_PID" 2>/dev/null || { tail -n 20 "$ROOT/run.log" >&2; die "pgconverge run exited"; }
	sleep 0.5
done
"$BIN" coverage --source "$SRC" --target "$TGT" --fail-on-gap >/dev/null || die "pgbench_accounts is not covered after 5 min"
q "$SRC" "VACUUM ANALYZE $TABLE"
q "$TGT" "VACUUM ANALYZE $TABLE"

# verify_json [FLAGS...]: runs verify on the table, leaves its JSON in $ROOT/verify.json and returns
# its exit status (0 or 4).
verify_json() {
	local rc=0
	"$BIN" verify --source "$SRC" --target "$TGT" --table "public.$TABLE" --format json --log-level warn "$@" >"$ROOT/verify.json" 2>>"$ROOT/verify.log" || rc=$?
	[ "$rc" = 0 ] || [ "$rc" = 4 ] || { cat "$ROOT/verify.log" >&2; die "verify exited $rc"; }
	return 0
}
found() { jq '.found' "$ROOT/verify.json"; }

# update3 R: updates 3 scattered source rows (R picks them) and waits until the stream applied them
# past the last verify's snapshot.
update3() {
	local keys="$((N / 4 + $1)), $((N / 2 + $1)), $((3 * N / 4 + $1))"
	q "$SRC" "UPDATE $TABLE SET abalance = abalance + 1 WHERE aid IN ($keys)"
	wait_for "$TGT" "SELECT count(*) FROM $TABLE WHERE aid IN ($keys) AND (_cdc_lsn, _cdc_seq) > ('$(jq -r .snapshot_lsn "$ROOT/verify.json")', 0)" 3
}

COUNT=() NAIVE=() VERIFY=() INC=() FIRST=() INC3=()
for r in $(seq "$ROUNDS"); do
	echo "== round $r: count(*), naive, verify (full), verify --incremental (unchanged), after a first change, after 3 more (equal tables)"
	t0=$(now)
	q "$SRC" "SELECT count(*) FROM $TABLE" >"$ROOT/c1" &
	q "$TGT" "SELECT count(*) FROM $TABLE WHERE NOT _cdc_deleted" >"$ROOT/c2"
	wait %%
	COUNT+=("$(since "$t0")")
	t0=$(now)
	q "$SRC" "COPY (SELECT $COLS FROM $TABLE ORDER BY aid) TO STDOUT" >"$ROOT/src.copy" &
	q "$TGT" "COPY (SELECT $COLS FROM $TABLE WHERE NOT _cdc_deleted ORDER BY aid) TO STDOUT" >"$ROOT/tgt.copy"
	wait %%
	cmp -s "$ROOT/src.copy" "$ROOT/tgt.copy" || die "naive comparison: the tables differ"
	NAIVE+=("$(since "$t0")")
	rm -f "$ROOT/src.copy" "$ROOT/tgt.copy"
	t0=$(now)
	verify_json
	VERIFY+=("$(since "$t0")")
	[ "$(found)" = 0 ] || die "verify (full) found $(found) discrepancies in equal tables"
	t0=$(now)
	verify_json --incremental
	INC+=("$(since "$t0")")
	[ "$(found)" = 0 ] || die "verify found $(found) discrepancies in equal tables"
	[ "$(jq '.tables[0].groups_skipped > 0 and .tables[0].ranges_checked == 1' "$ROOT/verify.json")" = true ] ||
		die "the incremental verify hashed groups of unchanged tables: $(jq -c '.tables[0]' "$ROOT/verify.json")"
	update3 $((2 * r))
	t0=$(now)
	verify_json --incremental
	FIRST+=("$(since "$t0")")
	[ "$(found)" = 0 ] || die "verify found $(found) discrepancies after a first change the stream applied"
	update3 $((2 * r + 1))
	t0=$(now)
	verify_json --incremental
	INC3+=("$(since "$t0")")
	[ "$(found)" = 0 ] || die "verify found $(found) discrepancies after 3 changes the stream applied"
	SKIPPED=$(jq '.tables[0].groups_skipped' "$ROOT/verify.json")
	NGROUPS=$(jq '.tables[0].groups_skipped + .tables[0].ranges_checked - 1' "$ROOT/verify.json")
	[ "$SKIPPED" -gt 0 ] && [ "$SKIPPED" -ge $((NGROUPS - 3)) ] || die "verify after 3 changes skipped $SKIPPED of $NGROUPS groups"
	printf '   count(*) %.2f s, naive %.2f s, verify (full) %.2f s, verify %.2f s, after a first change %.2f s, after 3 more %.2f s (%d of %d groups skipped)\n' \
		"${COUNT[-1]}" "${NAIVE[-1]}" "${VERIFY[-1]}" "${INC[-1]}" "${FIRST[-1]}" "${INC3[-1]}" "$SKIPPED" "$NGROUPS"
done

echo "== 100 scattered differences"
q "$TGT" "UPDATE $TABLE SET filler = 'bench-verify difference' WHERE aid IN (SELECT g * ($N / 100) - 7 FROM generate_series(1, 100) g)"
t0=$(now)
verify_json
DIFF_SECS=$(since "$t0")
[ "$(found)" = 100 ] || die "verify found $(found) of 100 differences"
FETCHED=$(jq '.tables[0].rows_fetched' "$ROOT/verify.json")
verify_json --repair
[ "$(jq '.open' "$ROOT/verify.json")" = 0 ] || die "verify --repair left discrepancies open"
verify_json
[ "$(found)" = 0 ] || die "verify found $(found) discrepancies after the repair"

c=$(median "${COUNT[@]}") n=$(median "${NAIVE[@]}") v=$(median "${VERIFY[@]}") i=$(median "${INC[@]}") f=$(median "${FIRST[@]}") i3=$(median "${INC3[@]}")
echo
echo "== results (medians of $ROUNDS, $N rows; both sides on this machine)"
printf '   count(*) both sides  %6.2f s\n' "$c"
printf '   naive fetch+compare  %6.2f s\n' "$n"
printf '   verify (full), equal %6.2f s   %.2fx faster than naive, %.2fx count(*)\n' "$v" "$(echo "$n / $v" | bc -l)" "$(echo "$v / $c" | bc -l)"
printf '   verify, equal        %6.2f s   %.2fx faster than naive (target >= 5), %.2fx count(*) (target <= 3) (incremental, nothing changed)\n' "$i" "$(echo "$n / $i" | bc -l)" "$(echo "$i / $c" | bc -l)"
printf '   verify, 1st change   %6.2f s   %.2fx faster than naive, %.2fx count(*) (incremental, the table hashed by groups)\n' "$f" "$(echo "$n / $f" | bc -l)" "$(echo "$f / $c" | bc -l)"
printf '   verify, 3 changed    %6.2f s   %.2fx faster than naive, %.2fx count(*) (incremental, 3 rows changed and applied)\n' "$i3" "$(echo "$n / $i3" | bc -l)" "$(echo "$i3 / $c" | bc -l)"
printf '   verify, 100 diffs    %6.2f s   rows fetched %d = %.3f%% of the table (target < 1%%)\n' "$DIFF_SECS" "$FETCHED" "$(echo "100 * $FETCHED / $N" | bc -l)"
