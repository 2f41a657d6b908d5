# shellcheck shell=bash
# bench/steady.sh — phase `steady`: each consumer alone streams while pgbench runs; the byte lag of
# its applied position and of its slot is sampled, then the time each takes to drain what is left
# when pgbench ends.

declare -A STEADY_LABEL=([native]="native logical replication" [conv]="pgconverge run")
SAMPLER_PID=

# sampler C FILE STOP: until file STOP exists, every SAMPLE s append "time applied-lag slot-lag"
# (bytes) to FILE: the source's pg_current_wal_lsn() minus C's applied position, and minus its
# slot's confirmed_flush_lsn. The applied position is read first (target), then in one statement
# the slot's position and the source's LSN, in that order, so a sample is never below the true
# lag; through sessions s_src and s_C of their own.
sampler() {
	local a b s line
	while [ ! -e "$3" ]; do
		b=$(sql_get "s_$1" "$(applied_sql "$1")")
		line=$(sql_get s_src "SELECT $(slot_lsn_sql "$1") - '0/0'::pg_lsn, pg_current_wal_lsn() - '0/0'::pg_lsn")
		s=${line%|*} a=${line#*|}
		echo "$EPOCHREALTIME $((a > b ? a - b : 0)) $((a > s ? a - s : 0))" >>"$2"
		sleep "$SAMPLE"
	done
}

# lag_stats KEY-PREFIX FILE: p50, p99 and max of FILE's numbers (bytes), in MB, added to RES
# (KEY-PREFIX p50, p99, max) and set in LAG_STATS (an array, in that order).
LAG_STATS=()
lag_stats() {
	local p50 p99 mx
	p50=$(calc "$(pctl "$2" 0.5) / 1000000") p99=$(calc "$(pctl "$2" 0.99) / 1000000") mx=$(calc "$(pctl "$2" 1) / 1000000")
	add "$1p50" "$p50"
	add "$1p99" "$p99"
	add "$1max" "$mx"
	LAG_STATS=("$p50" "$p99" "$mx")
}

steady_turn() {
	local c=$1 r=$2 end t_end f stop url hwm='' n
	local -a al=() sl=()
	consumer_start "$c" "steady round $r"
	end=$(mark)
	wait_applied "$c" "$end" # it starts at the head, applied and confirmed
	wait_slot "$c" "$end"
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
	wait_drained "$c" "$end" "$t_end"
	sql_close s_src
	sql_close "s_$c"
	awk -v t="$t_end" '$1 <= t { print $2 }' "$f" >"$f.bytes"
	awk -v t="$t_end" '$1 <= t { print $3 }' "$f" >"$f.slot"
	n=$(wc -l <"$f.bytes")
	[ "$n" -gt 0 ] || bench_die "steady: no lag sample for $c in round $r ($f)"
	lag_stats "steady|$c|" "$f.bytes"
	al=("${LAG_STATS[@]}")
	lag_stats "steady|$c|slot_" "$f.slot"
	sl=("${LAG_STATS[@]}")
	add "steady|$c|drain" "$DRAIN_APPLIED"
	add "steady|$c|slot_drain" "$DRAIN_SLOT"
	add "steady|$c|pgbench" "$TPS"
	add "steady|$c|samples" "$n"
	if [ "$c" = conv ]; then
		hwm=$(conv_hwm)
		add "steady|conv|rss" "$(kb_to_mib "$hwm")"
	fi
	printf '   round %s, %-27s applied lag p50 %7.2f MB, p99 %7.2f MB, max %7.2f MB, drain %6.2f s (%s samples), pgbench %.0f tps%s\n' \
		"$r" "${STEADY_LABEL[$c]}:" "${al[@]}" "$DRAIN_APPLIED" "$n" "$TPS" "${hwm:+, peak RSS $(num %.0f "$(kb_to_mib "$hwm")") MiB}"
	printf '   %36s slot lag p50 %7.2f MB, p99 %7.2f MB, max %7.2f MB, drain %6.2f s\n' '' "${sl[@]}" "$DRAIN_SLOT"
	consumer_stop "$c"
	consumer_check "$c"
}

# steady_target LABEL METRIC UNIT LIMIT: a summary line for pgconverge/native of METRIC's medians
# against LIMIT (a ratio); sets STEADY_X to the ratio. (Not in $(…): the summary is this shell's.)
STEADY_X=0
steady_target() {
	local x cv nv
	cv=$(med "steady|conv|$2") nv=$(med "steady|native|$2")
	x=$(ratio "$cv" "$nv")
	target "$1" "$(num %.2fx "$x") ($(num %.2f "$cv") vs $(num %.2f "$nv") $3)" "<= $(num %.2fx "$4")" "$(calc "$cv <= $4 * $nv")"
	STEADY_X=$x
}

phase_steady() {
	local r c x_p99 x_drain x_sp99 x_sdrain rss
	stream_setup
	echo
	echo "== steady: each consumer alone streams while pgbench -c 4 -j 2 -T $PGBENCH_SECS runs (lag sampled every $SAMPLE s)"
	for ((r = 1; r <= ROUNDS; r++)); do
		for c in $(ordered "$r" native conv); do steady_turn "$c" "$r"; done
	done

	phase_header "steady: lag while pgbench -c 4 -j 2 runs $PGBENCH_SECS s (sampled every $SAMPLE s), median of $ROUNDS"
	for c in native conv; do
		row "${STEADY_LABEL[$c]}, applied lag p50" "steady|$c|p50" %.2f MB
		row "${STEADY_LABEL[$c]}, applied lag p99" "steady|$c|p99" %.2f MB
		row "${STEADY_LABEL[$c]}, applied lag max" "steady|$c|max" %.2f MB
		row "${STEADY_LABEL[$c]}, applied drain" "steady|$c|drain" %.2f s
		row "${STEADY_LABEL[$c]}, slot lag p50" "steady|$c|slot_p50" %.2f MB
		row "${STEADY_LABEL[$c]}, slot lag p99" "steady|$c|slot_p99" %.2f MB
		row "${STEADY_LABEL[$c]}, slot lag max" "steady|$c|slot_max" %.2f MB
		row "${STEADY_LABEL[$c]}, slot drain" "steady|$c|slot_drain" %.2f s
		row "${STEADY_LABEL[$c]}, pgbench tps" "steady|$c|pgbench" %.0f
	done
	row "pgconverge peak RSS (VmHWM)" "steady|conv|rss" %.0f MiB
	row "lag samples per round, native" "steady|native|samples" %.0f
	row "lag samples per round, pgconverge" "steady|conv|samples" %.0f
	steady_target "steady applied lag p99: pgconv/native" p99 MB 1
	x_p99=$STEADY_X
	steady_target "steady applied drain: pgconv/native" drain s 1
	x_drain=$STEADY_X
	steady_target "steady slot lag p99: pgconv/native" slot_p99 MB 2
	x_sp99=$STEADY_X
	steady_target "steady slot drain: pgconv/native" slot_drain s 1.5
	x_sdrain=$STEADY_X
	printf '  ratios of medians (lower is better): pgconverge/native applied lag p99 %.2fx, drain %.2fx; slot lag p99 %.2fx, slot drain %.2fx\n' \
		"$x_p99" "$x_drain" "$x_sp99" "$x_sdrain" | out
	rss=$(maxof "$(vals 'steady|conv|rss')")
	target "peak RSS, steady" "$(num '%.0f MiB' "$rss")" "<= 256 MiB" "$(calc "$rss <= 256")"
}
