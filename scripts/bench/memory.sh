# shellcheck shell=bash
# bench/memory.sh — phase `memory`: pgconverge's peak RSS applying (a) one source transaction
# that updates MEM_ROWS rows and (b) one that inserts TOAST_MB rows of 1 MiB incompressible text
# (md5 strings; bench_toast.v has STORAGE EXTERNAL: out of line, never compressed). Each from a
# fresh daemon start, streaming and caught up; the native subscription stays disabled.

# memory_case KEY ROUND LABEL TABLE SQL: one case on a fresh daemon; records VmHWM and seconds.
memory_case() {
	local key=$1 r=$2 end t0 src_s apply_s hwm
	conv_start "memory round $r: $3"
	end=$(mark)
	wait_applied conv "$end"
	t0=$EPOCHREALTIME
	q "$SRC" "$5"
	src_s=$(calc "$EPOCHREALTIME - $t0")
	t0=$EPOCHREALTIME
	end=$(mark)
	wait_applied conv "$end"
	apply_s=$(calc "$EPOCHREALTIME - $t0")
	hwm=$(conv_hwm)
	conv_stop
	add "memory|$key|rss" "$(kb_to_mib "$hwm")"
	add "memory|$key|apply" "$apply_s"
	printf '   round %s, %-44s source %6.2f s, applied %6.2f s after its commit, peak RSS %4.0f MiB\n' \
		"$r" "$3:" "$src_s" "$apply_s" "$(kb_to_mib "$hwm")"
	check_equal "$CONV_URL" "NOT _cdc_deleted" "$4"
}

phase_memory() {
	local r rows=$MEM_ROWS note='' base a b
	stream_setup
	if ((rows > N)); then
		rows=$N
		note=" (scale $SCALE has only $N rows: all of them)"
	fi
	echo
	echo "== memory: pgconverge applying one big transaction each: $rows updated rows$note, $TOAST_MB MiB of TOASTed values"
	for ((r = 1; r <= ROUNDS; r++)); do
		memory_case update "$r" "1 transaction updating $rows rows" pgbench_accounts \
			"UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid <= $rows"
		base=$(((r - 1) * TOAST_MB))
		memory_case toast "$r" "1 transaction inserting $TOAST_MB x 1 MiB TOAST" bench_toast \
			"INSERT INTO bench_toast SELECT i, (SELECT string_agg(md5(random()::text || g || i), '')
				FROM generate_series(1, 32768) g) FROM generate_series($((base + 1)), $((base + TOAST_MB))) i"
	done

	phase_header "memory: pgconverge peak RSS (VmHWM from a fresh daemon start) applying one big source transaction, median of $ROUNDS"
	row "update of $rows rows$note" "memory|update|rss" %.0f MiB
	row "  its apply time after the commit" "memory|update|apply" %.2f s
	row "insert of $TOAST_MB MiB of TOASTed values" "memory|toast|rss" %.0f MiB
	row "  its apply time after the commit" "memory|toast|apply" %.2f s
	a=$(maxof "$(vals 'memory|update|rss')") b=$(maxof "$(vals 'memory|toast|rss')")
	target "peak RSS, memory: $rows-row update" "$(num '%.0f MiB' "$a")" "<= 256 MiB" "$(calc "$a <= 256")"
	target "peak RSS, memory: $TOAST_MB MiB TOAST insert" "$(num '%.0f MiB' "$b")" "<= 256 MiB" "$(calc "$b <= 256")"
}
