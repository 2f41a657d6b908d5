#!/usr/bin/env bash
# bench.sh — pgconverge against PostgreSQL's own logical replication, side by side, in one run on
# the same two private clusters: `source` (127.0.0.1:54401, wal_level=logical) and `target`
# (:54402) under /tmp/pgconverge-bench-all (BENCH_ROOT), pgbench at scale BENCH_SCALE (default 20:
# 2,000,000 rows in pgbench_accounts; pgbench_history gets a bigserial primary key `hid`).
# Each phase runs BENCH_ROUNDS rounds (default 3), the contenders' order alternating between
# rounds (A,B then B,A); only one contender runs at a time (the others are stopped), so none
# competes for the CPUs. Each phase reports the median per contender, every round, and the ratio
# of the medians, and fails loudly unless every target it filled equals the source: a count and an
# md5 over md5(ROW(source columns)::text) of each row in key order (pgconverge targets: WHERE NOT
# _cdc_deleted, without the _cdc_* columns). Phases (BENCH_PHASES, default load,catchup,steady,memory;
# they run in this order whatever the order given):
#
# load     the initial load of pgbench_accounts into a fresh, empty target database per attempt
#          (created, CHECKPOINT on both clusters, timed wall-clock, checked, dropped), by
#            raw pipe  a table from `pg_dump -s` (with its primary key), then `psql -c 'COPY …
#                      TO STDOUT' | psql -c 'COPY … FROM STDIN'` (text): the ceiling;
#            native    the same table; CREATE SUBSCRIPTION (copy_data) to a publication of it, timed
#                      until its pg_subscription_rel state is 's' or 'r';
#            pgconverge `pgconverge backfill` with default settings (it creates the table), and
#                      (BENCH_LOAD_EXTRA=1, the default) --workers 1 and --workers 4;
#          rows/s, pgconverge/native and pgconverge/raw, pgconverge's peak RSS (/usr/bin/time %M).
# catchup  consumers loaded, then stopped (native: ALTER SUBSCRIPTION … DISABLE; pgconverge: SIGTERM
#          to `pgconverge run`, waited for), plus a decode-only consumer: a pgoutput slot read by
#          pg_recvlogical (proto_version 1, a publication of the same tables) into /dev/null. Per
#          round a fresh backlog, `pgbench -n -c 4 -j 2 -T BENCH_SECONDS` (default 30) with all
#          stopped; then each consumer alone, timed from its start until it applied up to END,
#          the source's pg_current_wal_insert_lsn() after pgbench: native until its origin's
#          pg_replication_origin_status.remote_lsn >= END, pgconverge until pgconverge.progress
#          .applied_lsn >= END (both what the target committed; the slots' confirmed_flush_lsn lag
#          behind that: see steady), pg_recvlogical until it exits at --endpos=END.
#          Neither position moves without a replicated commit, so one row committed into
#          bench_marker right after reading END closes every measured stretch (the same here and
#          in the steady and memory phases). Transactions/s (pgbench's count / seconds),
#          pgconverge/native and pgconverge/decode-only, pgconverge's VmHWM. pgbench runs with -n:
#          its default VACUUM and TRUNCATE of pgbench_history first would be replicated too.
#          Waits poll every BENCH_POLL s through open psql sessions (not a new psql per poll).
# steady   each consumer alone (native enabled or the daemon started, applied and its slot
#          confirmed up to the current LSN first, so it starts at the head) while `pgbench -n -c 4
#          -j 2 -T BENCH_SECONDS` runs, unthrottled and then at each rate of BENCH_STEADY_RATES
#          (`-R`); every BENCH_SAMPLE s (default 0.2), through two open sessions, target first:
#          applied lag = source pg_current_wal_lsn() − applied position (what the target
#          committed, as in catchup); slot lag = the same LSN − confirmed_flush_lsn of the
#          consumer's slot (native: bench_native, the subscription's; pgconverge: its slot
#          `pgconverge`), what the source keeps WAL for and what a tool waiting for the slot sees;
#          freshness = the target's clock_timestamp() − mtime of its newest pgbench_history row
#          (by hid) in ms, how old the newest change a reader of the target sees is, with the same
#          read on the source as the floor; p50/p99/max of each over the samples taken while
#          pgbench ran (freshness from 1 s after its start). Drain, for each of the two positions
#          = from pgbench's end until it reaches END (polled together, every BENCH_POLL s).
#          pgconverge/native for the p99s, the freshness p50 and the drains. The consumer shares
#          the 2 cores with pgbench: pgbench's tps per contender is shown.
# memory   pgconverge streaming and caught up; one source transaction updating 1,000,000 rows of
#          pgbench_accounts (BENCH_MEM_ROWS; all rows at a smaller scale), then, from a new
#          daemon, one inserting 100 rows of 1 MiB of md5 text into bench_toast (BENCH_TOAST_MB;
#          STORAGE EXTERNAL: TOASTed, uncompressed); each waited for, checked, and pgconverge's
#          VmHWM since its start reported, with the time from the commit until it was applied.
# The summary compares the figures with the issue's targets (load ≥ 1.2× native; catch-up ≥ 1.0×
# native and ≥ 0.95× decode-only; steady applied lag p99, drain and freshness p50 and p99 ≤ native's; steady slot lag
# p99 ≤ 2× native's and slot drain ≤ 1.5× native's; peak RSS ≤ 256 MiB in every phase), informational: the exit status is 0 unless something failed or was unequal.
# The tables and summary are also written to ROOT/results.txt; logs (pgconverge's, pgbench's, the
# lag samples) are under ROOT/logs; both stay after the run, the clusters' data do not.
#
# Placement: pgconverge runs in a session of its own (setsid, which execs in place here: a
# background job of a script leads no process group), as a service does and as the servers do
# (pg_ctl detaches the postmaster; native replication's apply worker is a target server process).
# With the kernel's autogroup scheduling (/proc/sys/kernel/sched_autogroup_enabled), each session
# shares one CPU share: run from the bench's session, pgconverge shared pgbench's, and the
# source's walsender, in the source server's group with the four pgbench backends, stalled for
# seconds waiting on the run queue (steady lag p99 2–10x native's; 1.02x in its own session).
# The bench's source commits with synchronous_commit = off, so the walsender sends the
# transactions of each WAL writer flush (wal_writer_delay) at once: a steady lag of about one
# flush interval is the walsender's, for every contender.
#
# Environment: BENCH_QUICK=1 (a smoke run: scale 1, 1 round, 5 s, 100,000 rows, 10 MiB; each of
# these still yields to its own variable), BENCH_SCALE, BENCH_ROUNDS, BENCH_SECONDS,
# BENCH_SAMPLE (seconds between steady samples, default 0.2), BENCH_STEADY_RATES (the pgbench
# rates of the steady phase, transactions/s, comma-separated; default 0,500: unthrottled, where
# pgbench's 4 clients saturate both CPUs, then pgbench -R 500), BENCH_PHASES, BENCH_LOAD_EXTRA=0, BENCH_MEM_ROWS, BENCH_TOAST_MB,
# BENCH_POLL (default 0.02), BENCH_PORT (source port, default 54401; the target uses the next),
# BENCH_ROOT (the clusters, logs and results.txt; default /tmp/pgconverge-bench-all),
# PGCONVERGE_BIN (use this binary instead of building ./cmd/pgconverge, e.g. one built from an
# older commit for an A/B of two runs), PGCONVERGE_KEEP=1 (leave
# the clusters running, with the target databases; slots are dropped either way), PGBIN.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ROOT=${BENCH_ROOT:-/tmp/pgconverge-bench-all}
LOGS=$ROOT/logs
TMPD=$ROOT/tmp
RESULTS=$ROOT/results.txt
QUICK=${BENCH_QUICK:-0}
if [ "$QUICK" = 1 ]; then d_scale=1 d_rounds=1 d_secs=5 d_rows=100000 d_mb=10; else d_scale=20 d_rounds=3 d_secs=30 d_rows=1000000 d_mb=100; fi
SCALE=${BENCH_SCALE:-$d_scale}
ROUNDS=${BENCH_ROUNDS:-$d_rounds}
PGBENCH_SECS=${BENCH_SECONDS:-$d_secs}
MEM_ROWS=${BENCH_MEM_ROWS:-$d_rows}
TOAST_MB=${BENCH_TOAST_MB:-$d_mb}
SAMPLE=${BENCH_SAMPLE:-0.2}
STEADY_RATES=${BENCH_STEADY_RATES:-0,500}
POLL=${BENCH_POLL:-0.02}
LOAD_EXTRA=${BENCH_LOAD_EXTRA:-1}
PHASES=${BENCH_PHASES:-load,catchup,steady,memory}
SRC_PORT=${BENCH_PORT:-54401}
TGT_PORT=$((SRC_PORT + 1))
N=$((SCALE * 100000))
for p in ${PHASES//,/ }; do
	case $p in load | catchup | steady | memory) ;; *) echo "bench: unknown phase '$p' in BENCH_PHASES" >&2 && exit 2 ;; esac
done

# shellcheck source=bench/lib.sh
source "$REPO/scripts/bench/lib.sh"
# shellcheck source=bench/consumers.sh
source "$REPO/scripts/bench/consumers.sh"
# shellcheck source=bench/load.sh
source "$REPO/scripts/bench/load.sh"
# shellcheck source=bench/catchup.sh
source "$REPO/scripts/bench/catchup.sh"
# shellcheck source=bench/steady.sh
source "$REPO/scripts/bench/steady.sh"
# shellcheck source=bench/memory.sh
source "$REPO/scripts/bench/memory.sh"

# bench_cleanup, the EXIT trap (common.sh's stop_on_exit, but results.txt and the logs stay):
# stops the sampler and the daemon, drops the subscriptions and slots, then stops the clusters and
# removes their data unless PGCONVERGE_KEEP=1.
bench_cleanup() {
	local rc=$? db sub
	set +e
	trap '' PIPE # a session's psql may be gone (a ^C reaches every process of the group)
	[ -n "${SAMPLER_PID:-}" ] && touch "$TMPD/steady.stop" && wait "$SAMPLER_PID" 2>/dev/null
	[ -n "${DAEMON_PID:-}" ] && kill -TERM "$DAEMON_PID" 2>/dev/null && wait "$DAEMON_PID" 2>/dev/null
	sql_close_all 2>/dev/null
	if [ -n "${TGT_ADMIN:-}" ]; then
		q "$TGT_ADMIN" "SELECT d.datname || ' ' || s.subname FROM pg_subscription s JOIN pg_database d ON d.oid = s.subdbid" 2>/dev/null |
			while read -r db sub; do q "$(db_url "$db")" "DROP SUBSCRIPTION $sub" 2>/dev/null; done
		q "$SRC" "SELECT count(pg_drop_replication_slot(slot_name)) FROM pg_replication_slots WHERE NOT active" >/dev/null 2>&1
	fi
	if [ "${PGCONVERGE_KEEP:-}" = 1 ]; then
		echo "bench: PGCONVERGE_KEEP=1: clusters left running under $ROOT (source :$SRC_PORT, target :$TGT_PORT)"
	else
		"$PGCLUSTER" stop source "$ROOT"
		"$PGCLUSTER" stop target "$ROOT"
		rm -rf "${ROOT:?}/source" "${ROOT:?}/target" "${ROOT:?}/bin" "${TMPD:?}"
	fi
	exit "$rc"
}
trap bench_cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

command -v bc >/dev/null || apt-get install -y bc >/dev/null
[ -x /usr/bin/time ] || apt-get install -y time >/dev/null
mkdir -p "$ROOT"
rm -rf "$LOGS" "$TMPD" "$RESULTS"
mkdir -p "$LOGS" "$TMPD" "$ROOT/bin"
if [ -n "${PGCONVERGE_BIN:-}" ]; then
	BIN=$PGCONVERGE_BIN
	[ -x "$BIN" ] || bench_die "PGCONVERGE_BIN=$BIN is not an executable"
	BUILT="$BIN (PGCONVERGE_BIN)"
else
	BIN=$ROOT/bin/pgconverge
	go build -o "$BIN" ./cmd/pgconverge
	BUILT="built from $REPO"
	if rev=$(git rev-parse --short HEAD 2>/dev/null); then
		BUILT+=" at $rev$(git diff --quiet HEAD -- . 2>/dev/null || echo ' + uncommitted changes')"
	fi
fi
"$PGCLUSTER" start source "$SRC_PORT" "$ROOT" logical
"$PGCLUSTER" start target "$TGT_PORT" "$ROOT"
SRC=$("$PGCLUSTER" url source "$SRC_PORT")
TGT_ADMIN=$("$PGCLUSTER" url target "$TGT_PORT")
sql_open src "$SRC"

T_START=$SECONDS
{
	echo "pgconverge bench, $(date -Is), $(nproc) CPUs, PostgreSQL $(q "$SRC" "SHOW server_version")"
	echo "pgconverge: $BUILT"
	echo "scale $SCALE ($N rows in pgbench_accounts), $ROUNDS round(s), pgbench $PGBENCH_SECS s, steady sampled every $SAMPLE s at pgbench rates $STEADY_RATES (0: unthrottled), phases $PHASES$([ "$QUICK" = 1 ] && echo ' (BENCH_QUICK=1)')"
} | out
echo "== pgbench -i -s $SCALE on the source"
PGOPTIONS='-c client_min_messages=warning' "$PGBIN/pgbench" -i -s "$SCALE" -q "$SRC" 2>"$LOGS/pgbench-init.log" ||
	{ cat "$LOGS/pgbench-init.log" >&2; bench_die "pgbench -i failed"; }
q "$SRC" "ALTER TABLE pgbench_history ADD COLUMN hid bigserial PRIMARY KEY"
q "$SRC" "CREATE TABLE bench_marker (id bigserial PRIMARY KEY)"
q "$SRC" "CREATE TABLE bench_toast (id int PRIMARY KEY, v text)"
q "$SRC" "ALTER TABLE bench_toast ALTER COLUMN v SET STORAGE EXTERNAL"

for p in load catchup steady memory; do
	case ",$PHASES," in *",$p,"*) "phase_$p" ;; esac
done

{
	printf '\n== summary: the targets (informational; every phase checked its targets equal to the source)\n'
	printf '%s\n' "${SUMMARY[@]}"
	printf '  wall time %d s\n' "$((SECONDS - T_START))"
} | out
if [ -s "$LOGS/daemon.log" ]; then
	echo "pgconverge run log: $(grep -c 'level=WARN' "$LOGS/daemon.log") WARN, $(grep -c 'level=ERROR' "$LOGS/daemon.log") ERROR lines ($LOGS/daemon.log)"
fi
echo "results: $RESULTS"
