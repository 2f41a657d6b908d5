# shellcheck shell=bash
# bench/catchup.sh — phase `catchup`: each consumer works off the same pgbench backlog, alone.

declare -A CATCHUP_LABEL=(
	[native]="native logical replication"
	[conv]="pgconverge run"
	[decode]="decode only (pg_recvlogical)"
)

# decode_run END: pg_recvlogical reads slot bench_decode up to END into /dev/null.
decode_run() {
	"$PGBIN/pg_recvlogical" -h 127.0.0.1 -p "$SRC_PORT" -U postgres -d postgres --start -S bench_decode \
		--plugin=pgoutput -o proto_version=1 -o publication_names=bench_decode --no-loop \
		--endpos="$1" -f /dev/null 2>>"$LOGS/pg_recvlogical.log" ||
		bench_die "pg_recvlogical failed (log: $LOGS/pg_recvlogical.log)"
}

# decode_advance LSN-SQL: move slot bench_decode forward to LSN-SQL, if it is behind (after it is
# idle), so that no round decodes an earlier backlog again.
decode_advance() {
	wait_slot_idle bench_decode
	sql_get src "SELECT CASE WHEN confirmed_flush_lsn < $1 THEN (SELECT 1 FROM pg_replication_slot_advance('bench_decode', $1))
		ELSE 0 END FROM pg_replication_slots WHERE slot_name = 'bench_decode'" >/dev/null
}

# catchup_turn C ROUND END: time consumer C from its start until it applied up to END.
catchup_turn() {
	local c=$1 t0 secs hwm=''
	t0=$EPOCHREALTIME
	case $c in
	decode) decode_run "$3" ;;
	*)
		consumer_start "$c" "catchup round $2"
		wait_applied "$c" "$3"
		;;
	esac
	secs=$(calc "$EPOCHREALTIME - $t0")
	if [ "$c" = conv ]; then hwm=$(conv_hwm); fi
	if [ "$c" = decode ]; then decode_advance "'$3'::pg_lsn"; else consumer_stop "$c"; fi
	add "catchup|$c|tps" "$(calc "$TXNS / $secs")"
	add "catchup|$c|secs" "$secs"
	printf '   round %s, %-30s %7.2f s  %8.0f transactions/s%s\n' "$2" "${CATCHUP_LABEL[$c]}:" "$secs" \
		"$(calc "$TXNS / $secs")" "${hwm:+, peak RSS $(num %.0f "$(kb_to_mib "$hwm")") MiB}"
	if [ -n "$hwm" ]; then add "catchup|conv|rss" "$(kb_to_mib "$hwm")"; fi
	if [ "$c" != decode ]; then consumer_check "$c"; fi
}

phase_catchup() {
	local r c end x_native x_decode rss
	stream_setup
	echo
	echo "== catchup: a pgbench backlog of $PGBENCH_SECS s (all consumers stopped), then each consumer alone"
	q "$SRC" "CREATE PUBLICATION bench_decode FOR TABLE $(csv_tables "${STREAM_TABLES[@]}")"
	q "$SRC" "SELECT 1 FROM pg_create_logical_replication_slot('bench_decode', 'pgoutput')" >/dev/null
	for ((r = 1; r <= ROUNDS; r++)); do
		# Everyone starts at the head: native and pgconverge stopped there, the decode slot is moved.
		decode_advance "pg_current_wal_lsn()"
		run_pgbench "$PGBENCH_SECS" "$LOGS/pgbench-catchup-$r.log"
		end=$(mark)
		add "catchup|pgbench|tps" "$TPS"
		add "catchup|pgbench|txns" "$TXNS"
		printf '   round %s: backlog of %s transactions (pgbench %.0f tps), END %s\n' "$r" "$TXNS" "$TPS" "$end"
		for c in $(ordered "$r" native conv decode); do catchup_turn "$c" "$r" "$end"; done
	done
	q "$SRC" "SELECT pg_drop_replication_slot('bench_decode')" >/dev/null
	q "$SRC" "DROP PUBLICATION bench_decode"

	phase_header "catchup: working off a backlog of $PGBENCH_SECS s of pgbench -c 4 -j 2 (median $(med 'catchup|pgbench|txns') transactions), transactions/s, median of $ROUNDS"
	for c in native conv decode; do row "${CATCHUP_LABEL[$c]}" "catchup|$c|tps" %.0f; done
	row "pgbench, producing the backlog" "catchup|pgbench|tps" %.0f
	row "seconds, native" "catchup|native|secs" %.2f s
	row "seconds, pgconverge" "catchup|conv|secs" %.2f s
	row "seconds, decode only" "catchup|decode|secs" %.2f s
	row "pgconverge peak RSS (VmHWM)" "catchup|conv|rss" %.0f MiB
	x_native=$(ratio "$(med 'catchup|conv|tps')" "$(med 'catchup|native|tps')")
	x_decode=$(ratio "$(med 'catchup|conv|tps')" "$(med 'catchup|decode|tps')")
	printf '  ratios of medians: pgconverge/native %.2fx, pgconverge/decode-only %.2fx\n' "$x_native" "$x_decode" | out
	echo "  applied = native: its origin's remote_lsn; pgconverge: pgconverge.progress.applied_lsn (both >= END)" | out
	local tc tn td
	tc=$(num %.0f "$(med 'catchup|conv|tps')") tn=$(num %.0f "$(med 'catchup|native|tps')") td=$(num %.0f "$(med 'catchup|decode|tps')")
	target "catch-up: pgconverge / native" "$(num %.2fx "$x_native") ($tc vs $tn tx/s)" ">= 1.00x" "$(calc "$x_native >= 1.0")"
	target "catch-up: pgconverge / decode-only" "$(num %.2fx "$x_decode") ($tc vs $td tx/s)" ">= 0.95x" "$(calc "$x_decode >= 0.95")"
	rss=$(maxof "$(vals 'catchup|conv|rss')")
	target "peak RSS, catch-up" "$(num '%.0f MiB' "$rss")" "<= 256 MiB" "$(calc "$rss <= 256")"
}
