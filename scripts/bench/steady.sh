# shellcheck shell=bash
# bench/steady.sh — phase `steady`: each consumer alone streams while pgbench runs; its byte lag
# is sampled, then the time it takes to drain what is left when pgbench ends.

declare -A STEADY_LABEL=([native]="native logical replication" [conv]="pgconverge run")
SAMPLER_PID=

# sampler C FILE STOP: until file STOP exists, every SAMPLE s append "time lag-bytes" to FILE, the
# lag being the source's pg_current_wal_lsn() minus C's applied position, read target first (so a
# sample is never below the true lag), through sessions s_src and s_C of their own.
sampler() {
	local a b
	while [ ! -e "$3" ]; do
		b=$(sql_get "s_$1" "$(applied_sql "$1")")
		a=$(sql_get s_src "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
		echo "$EPOCHREALTIME $((a > b ? a - b : 0))" >>"$2"
		sleep "$SAMPLE"
	done
}

steady_turn() {
	local c=$1 r=$2 end t_end drain f stop url hwm='' p50 p99 mx n
	consumer_start "$c" "steady round $r"
	end=$(mark)
	wait_applied "$c" "$end" # it starts at the head
	url=$NATIVE_URL
	[ "$c" = native ] || url=$CONV_URL
	sql_open s_src "$SRC"
	sql_open "s_$c" "$url"
	f=$LOGS/steady-$c-$r.lag stop=$TMPD/steady.stop
	rm -f "$f" "$stop"
	sampler "$c" "$f" "$stop" &
	SAMPLER_PID=$!
	run_pgbench "$PGBENCH_SECS" "$LOGS/pgbench-steady-$c-$r.log" "$STEADY_RATE"
	t_end=$EPOCHREALTIME
	end=$(mark)
	touch "$stop"
	wait "$SAMPLER_PID" || bench_die "the lag sampler failed"
	SAMPLER_PID=
	wait_applied "$c" "$end"
	drain=$(calc "$EPOCHREALTIME - $t_end")
	sql_close s_src
	sql_close "s_$c"
	awk -v t="$t_end" '$1 <= t { print $2 }' "$f" >"$f.bytes"
	n=$(wc -l <"$f.bytes")
	[ "$n" -gt 0 ] || bench_die "steady: no lag sample for $c in round $r ($f)"
	p50=$(pctl "$f.bytes" 0.5) p99=$(pctl "$f.bytes" 0.99) mx=$(pctl "$f.bytes" 1)
	add "steady|$c|p50" "$(calc "$p50 / 1000000")"
	add "steady|$c|p99" "$(calc "$p99 / 1000000")"
	add "steady|$c|max" "$(calc "$mx / 1000000")"
	add "steady|$c|drain" "$drain"
	add "steady|$c|pgbench" "$TPS"
	add "steady|$c|samples" "$n"
	if [ "$c" = conv ]; then
		hwm=$(conv_hwm)
		add "steady|conv|rss" "$(kb_to_mib "$hwm")"
	fi
	printf '   round %s, %-27s lag p50 %7.2f MB, p99 %7.2f MB, max %7.2f MB (%s samples), drain %6.2f s, pgbench %.0f tps%s\n' \
		"$r" "${STEADY_LABEL[$c]}:" "$(calc "$p50 / 1000000")" "$(calc "$p99 / 1000000")" "$(calc "$mx / 1000000")" \
		"$n" "$drain" "$TPS" "${hwm:+, peak RSS $(num %.0f "$(kb_to_mib "$hwm")") MiB}"
	consumer_stop "$c"
	consumer_check "$c"
}

phase_steady() {
	local r c x_p99 x_drain rss
	stream_setup
	echo
	echo "== steady: each consumer alone streams while pgbench -c 4 -j 2 -T $PGBENCH_SECS runs (lag sampled every $SAMPLE s)"
	for ((r = 1; r <= ROUNDS; r++)); do
		for c in $(ordered "$r" native conv); do steady_turn "$c" "$r"; done
	done

	phase_header "steady: lag while pgbench -c 4 -j 2 runs $PGBENCH_SECS s (sampled every $SAMPLE s), median of $ROUNDS"
	for c in native conv; do
		row "${STEADY_LABEL[$c]}, lag p50" "steady|$c|p50" %.2f MB
		row "${STEADY_LABEL[$c]}, lag p99" "steady|$c|p99" %.2f MB
		row "${STEADY_LABEL[$c]}, lag max" "steady|$c|max" %.2f MB
		row "${STEADY_LABEL[$c]}, drain" "steady|$c|drain" %.2f s
		row "${STEADY_LABEL[$c]}, pgbench tps" "steady|$c|pgbench" %.0f
	done
	row "pgconverge peak RSS (VmHWM)" "steady|conv|rss" %.0f MiB
	row "lag samples per round, native" "steady|native|samples" %.0f
	row "lag samples per round, pgconverge" "steady|conv|samples" %.0f
	x_p99=$(ratio "$(med 'steady|conv|p99')" "$(med 'steady|native|p99')")
	x_drain=$(ratio "$(med 'steady|conv|drain')" "$(med 'steady|native|drain')")
	printf '  ratios of medians (lower is better): pgconverge/native lag p99 %.2fx, drain %.2fx\n' "$x_p99" "$x_drain" | out
	target "steady lag p99: pgconverge / native" "$(num %.2fx "$x_p99") ($(num %.2f "$(med 'steady|conv|p99')") vs $(num %.2f "$(med 'steady|native|p99')") MB)" "<= 1.00x" \
		"$(calc "$(med 'steady|conv|p99') <= $(med 'steady|native|p99')")"
	target "steady drain: pgconverge / native" "$(num %.2fx "$x_drain") ($(num %.2f "$(med 'steady|conv|drain')") vs $(num %.2f "$(med 'steady|native|drain')") s)" "<= 1.00x" \
		"$(calc "$(med 'steady|conv|drain') <= $(med 'steady|native|drain')")"
	rss=$(maxof "$(vals 'steady|conv|rss')")
	target "peak RSS, steady" "$(num '%.0f MiB' "$rss")" "<= 256 MiB" "$(calc "$rss <= 256")"
}
