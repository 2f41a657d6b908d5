#!/usr/bin/env bash
# bench-stream.sh — how fast pgconverge works off a streaming backlog, as a ratio to PostgreSQL's
# own logical replication working off the same backlog on the same machine in the same run.
#
# 1. starts private clusters `source` (127.0.0.1:54361, wal_level=logical) and `target` (:54362)
#    under /tmp/pgconverge-bench; loads pgbench scale 10 into the source (pgbench_history gets a
#    primary key, which pgconverge needs);
# 2. baseline: target database `native` with the pgbench schema and a subscription (copy_data) to
#    a publication of the four tables; waits for its initial sync, then disables it;
# 3. pgconverge: target database `conv`; `pgconverge run` does its initial load, then is stopped;
# 4. with both consumers stopped, pgbench -c 4 -j 2 runs for BENCH_SECONDS (default 30): both slots
#    now hold the same backlog;
# 5. enables the subscription and times until its slot confirms the source's WAL end; then starts
#    pgconverge and times the same; prints changes per second for both, the ratio, and
#    pgconverge's peak RSS.
# A pgbench transaction changes 4 rows (3 updates, 1 insert).
#
# Environment: BENCH_SECONDS (default 30), PGCONVERGE_KEEP=1 (keep /tmp/pgconverge-bench), PGBIN.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
ROOT=/tmp/pgconverge-bench
BIN=$ROOT/bin/pgconverge
SECS=${BENCH_SECONDS:-30}
DAEMON_PID=


trap stop_on_exit EXIT

# wait_slot SLOT LSN: wait (at most 600 s) until SLOT confirmed LSN.
wait_slot() {
	wait_for "$SRC" "SELECT confirmed_flush_lsn >= '$2'::pg_lsn FROM pg_replication_slots WHERE slot_name = '$1'" t
}


command -v bc >/dev/null || apt-get install -y bc >/dev/null
mkdir -p "$ROOT/bin"
go build -o "$BIN" ./cmd/pgconverge
"$PGCLUSTER" start source 54361 "$ROOT" logical
"$PGCLUSTER" start target 54362 "$ROOT"
SRC=$("$PGCLUSTER" url source 54361)
TGT_ADMIN=$("$PGCLUSTER" url target 54362)
NATIVE=${TGT_ADMIN/\/postgres\?/\/native?}
CONV=${TGT_ADMIN/\/postgres\?/\/conv?}
q "$TGT_ADMIN" "CREATE DATABASE native"
q "$TGT_ADMIN" "CREATE DATABASE conv"

echo "== pgbench -i -s 10 on the source"
PGOPTIONS='-c client_min_messages=warning' "$PGBIN/pgbench" -i -s 10 -q "$SRC"
q "$SRC" "ALTER TABLE pgbench_history ADD COLUMN hid bigserial PRIMARY KEY"

echo "== baseline: native logical replication, initial sync"
"$PGBIN/pg_dump" -s -t 'pgbench_*' "$SRC" | "$PGBIN/psql" -X -q -d "$NATIVE" >/dev/null
q "$SRC" "CREATE PUBLICATION native FOR TABLE pgbench_accounts, pgbench_branches, pgbench_tellers, pgbench_history"
q "$NATIVE" "CREATE SUBSCRIPTION native CONNECTION '$SRC' PUBLICATION native"
start=$SECONDS
until [ "$(q "$NATIVE" "SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'")" = 0 ]; do
	((SECONDS - start < 600)) || { echo "native initial sync timed out" >&2; exit 1; }
	sleep 0.5
done
q "$NATIVE" "ALTER SUBSCRIPTION native DISABLE"

echo "== pgconverge: initial load"
"$BIN" run --source "$SRC" --target "$CONV" --log-format text >"$ROOT/daemon.log" 2>&1 &
DAEMON_PID=$!
start=$SECONDS
until [ "$(q "$CONV" "SELECT count(*) FROM pgconverge.tables WHERE loaded_lsn IS NOT NULL" 2>/dev/null)" = 4 ]; do
	((SECONDS - start < 600)) || { echo "pgconverge initial load timed out" >&2; exit 1; }
	sleep 0.5
done
wait_slot pgconverge "$(q "$SRC" "SELECT pg_current_wal_insert_lsn()")"
kill -TERM "$DAEMON_PID"
wait "$DAEMON_PID"
DAEMON_PID=

echo "== backlog: pgbench -c 4 -j 2 -T $SECS with both consumers stopped"
"$PGBIN/pgbench" -c 4 -j 2 -T "$SECS" "$SRC" >"$ROOT/pgbench.log" 2>&1
TXNS=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$ROOT/pgbench.log")
TPS=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$ROOT/pgbench.log")
CHANGES=$((TXNS * 4))
LSN=$(q "$SRC" "SELECT pg_current_wal_insert_lsn()")
echo "pgbench: $TXNS transactions, $CHANGES row changes, $TPS tps; WAL end $LSN"

echo "== native logical replication works off the backlog"
t0=$(now)
q "$NATIVE" "ALTER SUBSCRIPTION native ENABLE"
wait_slot native "$LSN"
NATIVE_S=$(echo "$(now) - $t0" | bc -l)
q "$NATIVE" "ALTER SUBSCRIPTION native DISABLE"

echo "== pgconverge works off the backlog"
t0=$(now)
"$BIN" run --source "$SRC" --target "$CONV" --log-format text >>"$ROOT/daemon.log" 2>&1 &
DAEMON_PID=$!
wait_slot pgconverge "$LSN"
CONV_S=$(echo "$(now) - $t0" | bc -l)
RSS_KB=$(sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$DAEMON_PID/status")

printf '\n%-34s %10s %14s\n' "consumer" "seconds" "changes/s"
printf '%-34s %10.2f %14.0f\n' "native logical replication" "$NATIVE_S" "$(echo "$CHANGES / $NATIVE_S" | bc -l)"
printf '%-34s %10.2f %14.0f\n' "pgconverge" "$CONV_S" "$(echo "$CHANGES / $CONV_S" | bc -l)"
printf '%-34s %10s %14.0f\n' "pgbench (producing the backlog)" "$SECS" "$(echo "$TPS * 4" | bc -l)"
printf '\npgconverge / native: %.2fx   pgconverge / pgbench: %.2fx   pgconverge peak RSS: %d MB\n' \
	"$(echo "$NATIVE_S / $CONV_S" | bc -l)" "$(echo "($CHANGES / $CONV_S) / ($TPS * 4)" | bc -l)" "$((RSS_KB / 1024))"
