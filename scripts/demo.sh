#!/usr/bin/env bash
# demo.sh — see pgconverge work, end to end, in about two minutes (the README's first command).
#
# 1. builds the binary and starts two private PostgreSQL 15 clusters with scripts/pgcluster.sh:
#    `source` on 127.0.0.1:54331 (wal_level=logical) and `target` on 127.0.0.1:54332;
# 2. loads pgbench's tables into the source (scale 10, one million accounts);
# 3. starts `pgconverge run`, which creates the publication and slot `pgconverge` and does the
#    initial load, and waits until all four tables are loaded;
# 4. runs pgbench against the source for 30 s; 12 s in, kills the daemon with SIGKILL and starts
#    it again 3 s later, to show that a crash loses and duplicates nothing; then, while pgbench
#    still writes and the daemon streams, runs `pgconverge backfill` of pgbench_accounts, to show
#    that a backfill racing the stream does not disturb it;
# 5. waits until the slot confirms the source's final WAL position, then compares every table
#    (row count and checksum of the live rows, source columns only) between source and target,
#    and shows `pgconverge coverage` (exit 0: every table covered) and `pgconverge verify` (exit
#    0); then changes one account on the target by hand: verify finds it (exit 4) and `verify
#    --repair` repairs it;
# 6. makes a hole on purpose: stops the daemon, drops its slot, runs 200 pgbench transactions;
#    `pgconverge coverage --fail-on-gap` shows the gap and exits 3; restarts the daemon, which
#    creates a new slot and repairs the gap by comparison (--on-gap=repair: only the rows that
#    differ at the new slot's snapshot are written); coverage is back to exit 0 and the tables are
#    compared again.
# Exits 0 if all tables are equal, 1 if one differs or a wait times out.
#
# Everything lives in ROOT=/tmp/pgconverge-demo (binary, clusters, daemon.log, pgbench.log) and is
# removed on exit, also on Ctrl-C. Running it twice in a row is safe.
#
# Environment:
#   PGCONVERGE_DEMO_ROOT  the demo's folder (default /tmp/pgconverge-demo); wiped at start and end
#   PGCONVERGE_DEMO_PORT  source port (default 54331); the target uses the next one
#   PGCONVERGE_KEEP=1  keep ROOT (daemon.log, pgbench.log, cluster data and logs) after the run;
#                      the servers and the daemon are still stopped
#   PGBIN              PostgreSQL binaries (default /usr/lib/postgresql/15/bin)
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

ROOT=${PGCONVERGE_DEMO_ROOT:-/tmp/pgconverge-demo}
SOURCE_PORT=${PGCONVERGE_DEMO_PORT:-54331}
TARGET_PORT=$((SOURCE_PORT + 1))
BIN=$ROOT/bin/pgconverge
DAEMON_LOG=$ROOT/daemon.log
PGBENCH_LOG=$ROOT/pgbench.log
TABLES=(pgbench_accounts pgbench_branches pgbench_tellers pgbench_history)
WAIT_SECONDS=300

DAEMON_PID=
PGBENCH_PID=

step() { printf '\n== %s\n' "$*"; }

# q URL SQL: run one query, print the result unaligned, fields separated by a space.
q() { "$PGBIN/psql" -X -q -A -t -F ' ' -v ON_ERROR_STOP=1 -d "$1" -c "$2"; }

show_daemon_log() {
	if [ -s "$DAEMON_LOG" ]; then
		echo "---- last 30 lines of $DAEMON_LOG ----" >&2
		tail -n 30 "$DAEMON_LOG" >&2
		echo "----" >&2
	fi
}

fail() {
	echo "demo: FAILED: $*" >&2
	show_daemon_log
	exit 1
}

start_daemon() {
	"$BIN" run --source "$SRC" --target "$TGT" --log-format text </dev/null >>"$DAEMON_LOG" 2>&1 &
	DAEMON_PID=$!
	echo "$DAEMON_PID" >"$ROOT/daemon.pid"
	echo "daemon started (pid $DAEMON_PID), logging to $DAEMON_LOG"
}

# stop_daemon sends SIGTERM and waits up to 20 s for a clean exit.
stop_daemon() {
	kill -TERM "$DAEMON_PID" 2>/dev/null || true
	for _ in $(seq 1 40); do
		kill -0 "$DAEMON_PID" 2>/dev/null || break
		sleep 0.5
	done
	if kill -0 "$DAEMON_PID" 2>/dev/null; then
		fail "the daemon did not exit within 20 s of SIGTERM"
	fi
	local rc=0
	wait "$DAEMON_PID" || rc=$?
	DAEMON_PID=
	echo "daemon exited with status $rc"
	[ "$rc" -eq 0 ] || fail "the daemon exited with status $rc"
}

# A daemon or pgbench left behind by an earlier run that was killed before it could clean up
# would keep writing to the new clusters; stop them. ROOT/NAME.pid holds their PIDs.
stop_stale() { # NAME COMMAND-LINE-PREFIX
	local pid
	pid=$(cat "$ROOT/$1.pid" 2>/dev/null) || return 0
	[[ $pid =~ ^[0-9]+$ ]] || return 0
	if tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF "$2"; then
		echo "stopping the $1 of an earlier run (pid $pid)"
		kill -KILL "$pid" 2>/dev/null || true
	fi
}

# poll WHAT CHECK...: run CHECK every second until it succeeds; give up after WAIT_SECONDS or when
# the daemon is gone.
poll() {
	local what=$1 start=$SECONDS rc
	shift
	until "$@"; do
		if ! kill -0 "$DAEMON_PID" 2>/dev/null; then
			rc=0
			wait "$DAEMON_PID" || rc=$?
			DAEMON_PID=
			fail "the daemon exited (status $rc) while waiting for $what"
		fi
		if ((SECONDS - start >= WAIT_SECONDS)); then
			fail "timed out after ${WAIT_SECONDS}s waiting for $what"
		fi
		if (((SECONDS - start) % 15 == 14)); then
			echo "  still waiting for $what ($((SECONDS - start))s)"
		fi
		sleep 1
	done
	echo "  done in $((SECONDS - start))s"
}

# initial_load_done: all four tables have a completed load. A target without the pgconverge schema
# or table yet (the daemon has not created it) just means "not yet".
initial_load_done() {
	local n
	n=$(q "$TGT" "SELECT count(*) FROM pgconverge.tables
	              WHERE loaded_lsn IS NOT NULL AND schema_name = 'public'
	                AND table_name IN ('pgbench_accounts', 'pgbench_branches',
	                                   'pgbench_tellers', 'pgbench_history')" 2>/dev/null) || return 1
	[ "$n" -ge 4 ]
}

covered() { "$BIN" coverage --source "$SRC" --target "$TGT" --fail-on-gap --format json >/dev/null 2>&1; }

slot_caught_up() { # LSN
	[ "$(q "$SRC" "SELECT confirmed_flush_lsn >= '$1'::pg_lsn FROM pg_replication_slots
	               WHERE slot_name = 'pgconverge'" 2>/dev/null)" = t ]
}

# compare_table TABLE: print "table rows_source rows_target checksum equal=yes|no"; return 1 if
# the source and the live target rows differ. The target side reads only the source's columns.
DIFFERENT=0
compare_table() {
	local table=$1 cols pk sql src tgt n_src sum_src n_tgt sum_tgt equal=no checksum
	cols=$(q "$SRC" "SELECT string_agg(format('%I', column_name), ', ' ORDER BY ordinal_position)
	                 FROM information_schema.columns
	                 WHERE table_schema = 'public' AND table_name = '$table'")
	pk=$(q "$SRC" "SELECT string_agg(format('%I', a.attname), ', ' ORDER BY k.ord)
	               FROM pg_index i
	               CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
	               JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
	               WHERE i.indrelid = 'public.$table'::regclass AND i.indisprimary")
	if [ -z "$cols" ] || [ -z "$pk" ]; then
		fail "cannot read the columns or primary key of public.$table"
	fi
	sql="SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY $pk), ''))
	     FROM (SELECT $cols FROM public.$table"
	src=$(q "$SRC" "$sql) t")
	if ! tgt=$(q "$TGT" "$sql WHERE NOT _cdc_deleted) t" 2>&1); then
		echo "  target: $tgt" >&2
		tgt="- -"
	fi
	read -r n_src sum_src <<<"$src"
	read -r n_tgt sum_tgt <<<"$tgt"
	checksum=${sum_src:0:12}
	if [ "$n_src" = "$n_tgt" ] && [ "$sum_src" = "$sum_tgt" ]; then
		equal=yes
	else
		checksum="$checksum/${sum_tgt:0:12}"
		DIFFERENT=1
	fi
	printf '%-18s %12s %12s  %-12s  equal=%s\n' "$table" "$n_src" "$n_tgt" "$checksum" "$equal"
}

# shellcheck disable=SC2317  # invoked by the EXIT trap
cleanup() {
	local rc=$?
	set +e
	trap - INT TERM
	if [ -n "$PGBENCH_PID" ]; then
		kill -TERM "$PGBENCH_PID" 2>/dev/null
		wait "$PGBENCH_PID" 2>/dev/null
	fi
	if [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then
		kill -TERM "$DAEMON_PID" 2>/dev/null
		for _ in $(seq 1 50); do
			kill -0 "$DAEMON_PID" 2>/dev/null || break
			sleep 0.2
		done
		kill -KILL "$DAEMON_PID" 2>/dev/null
		wait "$DAEMON_PID" 2>/dev/null
	fi
	"$PGCLUSTER" stop source "$ROOT"
	"$PGCLUSTER" stop target "$ROOT"
	if [ "${PGCONVERGE_KEEP:-}" = 1 ]; then
		echo "PGCONVERGE_KEEP=1: keeping $ROOT (daemon.log, pgbench.log, cluster data and logs)"
	else
		rm -rf "$ROOT"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step "building pgconverge into $BIN"
stop_stale daemon "$BIN run "
stop_stale pgbench "$PGBIN/pgbench -c "
mkdir -p "$ROOT/bin"
go build -o "$BIN" ./cmd/pgconverge

step "starting PostgreSQL clusters under $ROOT"
"$PGCLUSTER" start source "$SOURCE_PORT" "$ROOT" logical
"$PGCLUSTER" start target "$TARGET_PORT" "$ROOT"
SRC=$("$PGCLUSTER" url source "$SOURCE_PORT")
TGT=$("$PGCLUSTER" url target "$TARGET_PORT")
echo "source: $SRC"
echo "target: $TGT"

step "loading pgbench tables into the source (scale 10: 1,000,000 accounts)"
# client_min_messages: hide the server's "table does not exist, skipping" notices.
PGOPTIONS='-c client_min_messages=warning' "$PGBIN/pgbench" -i -s 10 -q "$SRC"
echo "pgbench_history has no primary key and no REPLICA IDENTITY FULL: no publication can carry"
echo "its UPDATEs and DELETEs, so pgconverge would keep it by snapshots only (reloaded at each"
echo "--snapshot-schedule tick, hourly by default). To stream it, we give it a key:"
echo "  ALTER TABLE pgbench_history ADD COLUMN hid bigserial PRIMARY KEY"
q "$SRC" "ALTER TABLE pgbench_history ADD COLUMN hid bigserial PRIMARY KEY"

step "starting the daemon: pgconverge run --source $SRC --target $TGT"
: >"$DAEMON_LOG"
start_daemon

step "waiting for the initial load of the 4 tables (target's pgconverge.tables.loaded_lsn)"
poll "the initial load" initial_load_done

step "running pgbench on the source for 30 s (-c 4 -j 2), output in $PGBENCH_LOG"
echo "(pgbench first vacuums its tables and TRUNCATEs pgbench_history, as before every run: the"
echo " stream applies the TRUNCATE, so pgbench_history holds only the rows of the latest run)"
"$PGBIN/pgbench" -c 4 -j 2 -T 30 -P 5 "$SRC" </dev/null >"$PGBENCH_LOG" 2>&1 &
PGBENCH_PID=$!
echo "$PGBENCH_PID" >"$ROOT/pgbench.pid"
sleep 12
kill -0 "$DAEMON_PID" 2>/dev/null || fail "the daemon exited on its own during the pgbench run"
echo "crash test: kill -9 the daemon (pid $DAEMON_PID) while pgbench is writing"
kill -KILL "$DAEMON_PID"
wait "$DAEMON_PID" 2>/dev/null || true
DAEMON_PID=
sleep 3
echo "---- demo.sh: daemon killed with SIGKILL, restarting ----" >>"$DAEMON_LOG"
start_daemon
echo "backfill while pgbench writes and the daemon streams:"
echo "  pgconverge backfill --table public.pgbench_accounts --workers 2 (log in $ROOT/backfill.log)"
if ! "$BIN" backfill --source "$SRC" --target "$TGT" --table public.pgbench_accounts --workers 2 \
	--log-format text 2>"$ROOT/backfill.log"; then
	tail -n 20 "$ROOT/backfill.log" >&2
	fail "pgconverge backfill failed"
fi
echo "waiting for pgbench to finish"
if ! wait "$PGBENCH_PID"; then
	PGBENCH_PID=
	tail -n 20 "$PGBENCH_LOG" >&2
	fail "pgbench failed"
fi
PGBENCH_PID=

# The insert position covers every commit pgbench saw return; pg_current_wal_lsn() may lag behind
# it on these clusters, which run with synchronous_commit = off.
LSN=$(q "$SRC" "SELECT pg_current_wal_insert_lsn()")
step "waiting until the slot has confirmed the source's WAL position $LSN"
poll "confirmed_flush_lsn >= $LSN" slot_caught_up "$LSN"

step "comparing source and target (live rows, source columns, ordered by primary key)"
printf '%-18s %12s %12s  %-12s  %s\n' table rows_source rows_target checksum equal
for t in "${TABLES[@]}"; do
	compare_table "$t"
done

step "pgbench"
grep -E '^tps' "$PGBENCH_LOG" || echo "(no tps line in $PGBENCH_LOG)"

step "daemon: initial load and catch-up rates (full log: $DAEMON_LOG)"
grep -E 'backfilled table|backfill completed|caught up' "$DAEMON_LOG" | tail -n 20 || echo "(none)"
echo "(a pgbench transaction changes 4 rows: 3 updates and 1 insert; the 'caught up' line after the"
echo " restart gives the rows per second pgconverge applied while it worked off the backlog)"

step "coverage: pgconverge coverage --fail-on-gap (every table covered, exit 0)"
"$BIN" coverage --source "$SRC" --target "$TGT" --fail-on-gap || fail "pgconverge coverage reports a gap or failed"

step "verify: pgconverge verify (the data itself, at an exact snapshot; exit 0: nothing open)"
"$BIN" verify --source "$SRC" --target "$TGT" --log-level warn || fail "pgconverge verify found discrepancies or failed"
echo "an operator's write on the target: UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = 4242"
q "$TGT" "UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = 4242" >/dev/null
rc=0
"$BIN" verify --source "$SRC" --target "$TGT" --table public.pgbench_accounts --log-level warn || rc=$?
[ "$rc" -eq 4 ] || fail "pgconverge verify exited $rc after the target was changed by hand, want 4 (open discrepancies)"
echo "(exit status 4: one 'different' row, recorded in pgconverge.discrepancies on the target)"
"$BIN" verify --source "$SRC" --target "$TGT" --table public.pgbench_accounts --repair --log-level warn ||
	fail "pgconverge verify --repair left discrepancies open"
echo "(repaired from a fresh exact snapshot through the apply step, and closed in the same transaction)"

step "a hole on purpose: stop the daemon, drop its slot, run 200 pgbench transactions"
stop_daemon
q "$SRC" "SELECT pg_drop_replication_slot('pgconverge')" >/dev/null
"$PGBIN/pgbench" -c 1 -t 200 "$SRC" </dev/null >>"$PGBENCH_LOG" 2>&1 || fail "pgbench failed"
echo "(pgbench truncated pgbench_history first again: it holds these 200 transactions' rows now)"
rc=0
"$BIN" coverage --source "$SRC" --target "$TGT" --fail-on-gap || rc=$?
[ "$rc" -eq 3 ] || fail "pgconverge coverage exited $rc after the slot was dropped, want 3 (a gap)"
echo "(exit status 3: the writes made while no slot kept WAL for pgconverge are a gap, to the byte)"

step "restarting the daemon: it creates a new slot and, with --on-gap=repair (the default), repairs the gap by comparison"
echo "---- demo.sh: slot dropped, restarting ----" >>"$DAEMON_LOG"
start_daemon
poll "pgconverge coverage --fail-on-gap to exit 0" covered
"$BIN" coverage --source "$SRC" --target "$TGT"
echo "the daemon's log lines about the gap and its repair:"
grep -E 'coverage gap|stream coverage broken|gap repaired' "$DAEMON_LOG" || true
LSN=$(q "$SRC" "SELECT pg_current_wal_insert_lsn()")
poll "confirmed_flush_lsn >= $LSN" slot_caught_up "$LSN"
step "comparing source and target again, after the gap repair"
printf '%-18s %12s %12s  %-12s  %s\n' table rows_source rows_target checksum equal
for t in "${TABLES[@]}"; do
	compare_table "$t"
done

step "stopping the daemon with SIGTERM"
stop_daemon

if [ "$DIFFERENT" -ne 0 ]; then
	echo
	echo "demo: FAILED: source and target differ (see above)" >&2
	exit 1
fi
echo
echo "demo: OK — all ${#TABLES[@]} tables are equal in source and target, despite the kill -9 and the dropped slot."
