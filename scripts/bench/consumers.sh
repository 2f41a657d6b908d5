# shellcheck shell=bash
# bench/consumers.sh — the two streaming consumers of the catchup, steady and memory phases, on
# the target cluster, set up once (stream_setup) and then started and stopped by the phases:
#   native  database `native`: the pgbench schema from pg_dump -s and CREATE SUBSCRIPTION
#           bench_native (default settings) to publication bench_native; started with ALTER
#           SUBSCRIPTION … ENABLE, stopped with DISABLE (and waiting until its slot is inactive);
#   conv    database `conv`: `pgconverge run --tables …` (publication and slot `pgconverge`),
#           started as a daemon (DAEMON_PID) in a session of its own (setsid: see bench.sh),
#           stopped with SIGTERM and waiting for its exit.
# Both follow STREAM_TABLES; pgconverge also bench_toast (memory phase). The position a
# consumer has applied (applied_sql C) is what the target committed:
#   native  pg_replication_origin_status.remote_lsn of the subscription's origin (pg_<oid>): set
#           in the same transaction as the applied commit, to that commit's end LSN; the slot's
#           confirmed_flush_lsn would lag by the subscriber's WAL flush and feedback interval;
#   conv    pgconverge.progress.applied_lsn of slot pgconverge (written with the data it covers);
#           the slot's confirmed_flush_lsn is held back behind it until a catalog check vouches
#           for the position (builds before 9a38348: 5–10 s; since: a 200 ms probe or two).
# Each consumer's slot on the source (SLOT[C]: bench_native, the subscription's default slot name;
# pgconverge, the daemon's default --slot) is what the source keeps WAL for and what a tool that
# waits for the slot sees: slot_lsn_sql C is its confirmed_flush_lsn, wait_slot C END waits on it,
# wait_drained C END T0 times both positions at once.
# Neither moves on a WAL record that is not a transaction of a published table, so `mark` ends
# every measured stretch with one: it reads pg_current_wal_insert_lsn() (END) and then commits one
# row into bench_marker; a consumer has applied up to END when that row's commit is applied.

STREAM_TABLES=(pgbench_accounts pgbench_branches pgbench_tellers pgbench_history bench_marker)
STREAM_READY=0
DAEMON_PID=
declare -A POS=(
	[native]="coalesce((SELECT s.remote_lsn FROM pg_replication_origin_status s JOIN pg_subscription sub
		ON s.external_id = 'pg_' || sub.oid WHERE sub.subname = 'bench_native'), '0/0')"
	[conv]="coalesce((SELECT applied_lsn FROM pgconverge.progress WHERE slot = 'pgconverge'), '0/0')"
)

declare -A SLOT=([native]=bench_native [conv]=pgconverge)

csv_tables() { local t s=''; for t in "$@"; do s+="public.$t,"; done; echo "${s%,}"; }

mark() {
	local lsn
	lsn=$(sql_get src "SELECT pg_current_wal_insert_lsn()")
	sql_get src "INSERT INTO bench_marker DEFAULT VALUES RETURNING 1" >/dev/null
	echo "$lsn"
}

# wait_applied C END: until consumer C has applied (committed on the target) past END.
wait_applied() {
	WATCH_PID=
	[ "$1" = conv ] && WATCH_PID=$DAEMON_PID
	wait_true "$1" "SELECT ${POS[$1]} >= '$2'::pg_lsn"
	WATCH_PID=
}
# applied_sql C: SQL for the applied position of C in bytes from 0/0.
applied_sql() { echo "SELECT ${POS[$1]} - '0/0'::pg_lsn"; }

# slot_lsn_sql C: an expression (read on the source) for C's slot's confirmed_flush_lsn, 0/0 if
# the slot is missing.
slot_lsn_sql() {
	echo "coalesce((SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '${SLOT[$1]}'), '0/0')"
}
# wait_slot C END: until C's slot is confirmed (confirmed_flush_lsn) past END, at most 120 s.
wait_slot() {
	WATCH_PID=
	[ "$1" = conv ] && WATCH_PID=$DAEMON_PID
	wait_true src "SELECT $(slot_lsn_sql "$1") >= '$2'::pg_lsn" 120
	WATCH_PID=
}
# wait_drained C END T0: poll, every BENCH_POLL s and in the same pass, C's applied position
# (session C, on the target) and its slot's confirmed_flush_lsn (session src) until both reach
# END (at most 900 s); sets DRAIN_APPLIED and DRAIN_SLOT to the seconds from T0 (an
# EPOCHREALTIME) to the first poll that saw each there, so neither wait delays the other's time.
wait_drained() {
	local c=$1 end=$2 t0=$3 start=$SECONDS ta='' ts='' qa qs
	qa="SELECT ${POS[$c]} >= '$end'::pg_lsn"
	qs="SELECT $(slot_lsn_sql "$c") >= '$end'::pg_lsn"
	WATCH_PID=
	[ "$c" = conv ] && WATCH_PID=$DAEMON_PID
	while :; do
		[ -z "$ta" ] && [ "$(sql_get "$c" "$qa")" = t ] && ta=$EPOCHREALTIME
		[ -z "$ts" ] && [ "$(sql_get src "$qs")" = t ] && ts=$EPOCHREALTIME
		[ -n "$ta" ] && [ -n "$ts" ] && break
		watch_alive "$qa; $qs"
		((SECONDS - start < 900)) || bench_die "timed out after 900 s waiting for $c to drain: ${ta:-$qa} ${ts:-$qs}"
		sleep "$POLL"
	done
	WATCH_PID=
	# shellcheck disable=SC2034 # read by the steady phase
	DRAIN_APPLIED=$(calc "$ta - $t0") DRAIN_SLOT=$(calc "$ts - $t0")
}

wait_slot_idle() {
	wait_true src "SELECT coalesce((SELECT NOT active FROM pg_replication_slots WHERE slot_name = '$1'), true)" 120
}

native_start() { q "$NATIVE_URL" "ALTER SUBSCRIPTION bench_native ENABLE"; }
native_stop() {
	q "$NATIVE_URL" "ALTER SUBSCRIPTION bench_native DISABLE"
	wait_slot_idle bench_native
}

conv_start() {
	[ -z "$DAEMON_PID" ] || bench_die "conv_start: the daemon already runs (pid $DAEMON_PID)"
	printf '\n===== %s pgconverge run (%s)\n' "$(date -Is)" "$1" >>"$LOGS/daemon.log"
	setsid "$BIN" run --source "$SRC" --target "$CONV_URL" --tables "$(csv_tables "${STREAM_TABLES[@]}" bench_toast)" \
		--log-format text >>"$LOGS/daemon.log" 2>&1 &
	DAEMON_PID=$!
}
# conv_hwm: the running daemon's peak RSS so far (VmHWM), in kB.
conv_hwm() { sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$DAEMON_PID/status"; }
conv_stop() {
	local rc=0 t0=$SECONDS
	[ -n "$DAEMON_PID" ] || return 0
	kill -TERM "$DAEMON_PID"
	wait "$DAEMON_PID" || rc=$?
	DAEMON_PID=
	((SECONDS - t0 < 10)) || echo "   note: pgconverge took $((SECONDS - t0)) s to exit after SIGTERM"
	[ "$rc" = 0 ] || bench_die "pgconverge run exited with status $rc after SIGTERM (log: $LOGS/daemon.log)"
	wait_slot_idle pgconverge
}
consumer_start() { if [ "$1" = native ]; then native_start; else conv_start "$2"; fi; }
consumer_stop() { if [ "$1" = native ]; then native_stop; else conv_stop; fi; }
# consumer_check C: C's target equals the source (the source must be quiet).
consumer_check() {
	if [ "$1" = native ]; then
		check_equal "$NATIVE_URL" "" "${STREAM_TABLES[@]}"
	else
		check_equal "$CONV_URL" "NOT _cdc_deleted" "${STREAM_TABLES[@]}"
	fi
}

# stream_setup: both consumers loaded (their initial syncs run at once: not measured), caught up,
# and stopped.
stream_setup() {
	local t n end
	[ "$STREAM_READY" = 1 ] && return 0
	echo
	echo "== setup: native subscription and pgconverge run load their targets (not measured)"
	NATIVE_URL=$(db_url native) CONV_URL=$(db_url conv)
	fresh_db native "${STREAM_TABLES[@]}"
	fresh_db conv
	q "$SRC" "CREATE PUBLICATION bench_native FOR TABLE $(csv_tables "${STREAM_TABLES[@]}")"
	q "$NATIVE_URL" "CREATE SUBSCRIPTION bench_native CONNECTION '$SRC' PUBLICATION bench_native"
	conv_start setup
	sql_open native "$NATIVE_URL"
	sql_open conv "$CONV_URL"
	n=${#STREAM_TABLES[@]}
	wait_true native "SELECT count(*) = $n FROM pg_subscription_rel WHERE srsubstate = 'r'"
	# shellcheck disable=SC2034 # read by wait_true
	WATCH_PID=$DAEMON_PID
	wait_true conv "SELECT to_regclass('pgconverge.progress') IS NOT NULL AND to_regclass('pgconverge.tables') IS NOT NULL"
	wait_true conv "SELECT count(*) = $((n + 1)) FROM pgconverge.tables WHERE loaded_lsn IS NOT NULL"
	end=$(mark)
	for t in native conv; do wait_applied "$t" "$end"; done
	native_stop
	conv_stop
	for t in native conv; do consumer_check "$t"; done
	STREAM_READY=1
}
