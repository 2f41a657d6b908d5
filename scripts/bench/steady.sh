# shellcheck shell=bash
# bench/steady.sh — phase `steady`: each consumer alone streams while pgbench runs (unthrottled,
# then at each fixed rate of BENCH_STEADY_RATES); the byte lag of its applied position and of its
# slot, and the freshness of its target, are sampled, then the time each position takes to drain
# what is left when pgbench ends.

declare -A STEADY_LABEL=([native]="native logical replication" [conv]="pgconverge run")
SAMPLER_PID=

# FRESH_SQL: the freshness of a database's pgbench_history in milliseconds: now (clock_timestamp)
# minus the mtime (pgbench's transaction start) of its newest row by the bigserial key hid. On the
# target it is how old the newest visible change is; on the source, read at the same moment, it is
# the floor that an instantly applied copy would show (pgbench's transaction time and the gap to
# its next commit).
FRESH_SQL="(SELECT round(extract(epoch FROM clock_timestamp() - mtime) * 1000, 1) FROM pgbench_history ORDER BY hid DESC LIMIT 1)"

# sampler C FILE STOP: until file STOP exists, every SAMPLE s append "time applied-lag slot-lag
# target-freshness source-freshness" to FILE: the source's pg_current_wal_lsn() minus C's applied
# position, and minus its slot's confirmed_flush_lsn (bytes); FRESH_SQL on C's target and on the
# source (ms). The target is read first (applied position and freshness in one statement), then in
# one statement the slot's position, the source's LSN and its freshness, in that order, so a
# sample is never below the true lag; through sessions s_src and s_C of their own.
sampler() {
	local a b s ft fs line
	while [ ! -e "$3" ]; do
		line=$(sql_get "s_$1" "SELECT (${POS[$1]} - '0/0'::pg_lsn)::text || '|' || coalesce($FRESH_SQL::text, '')")
		b=${line%|*} ft=${line#*|}
		line=$(sql_get s_src "SELECT $(slot_lsn_sql "$1") - '0/0'::pg_lsn, pg_current_wal_lsn() - '0/0'::pg_lsn, $FRESH_SQL")
		s=${line%%|*} line=${line#*|}
		a=${line%|*} fs=${line#*|}
		echo "$EPOCHREALTIME $((a > b ? a - b : 0)) $((a > s ? a - s : 0)) ${ft:-0} ${fs:-0}" >>"$2"
		sleep "$SAMPLE"
	done
}

# lag_stats KEY-PREFIX FILE [DIV]: p50, p99 and max of FILE's numbers divided by DIV (default
# 1000000: bytes to MB), added to RES (KEY-PREFIX p50, p99, max) and set in LAG_STATS (an array,
# in that order).
LAG_STATS=()
lag_stats() {
	local p50 p99 mx d=${3:-1000000}
	p50=$(calc "$(pctl "$2" 0.5) / $d") p99=$(calc "$(pctl "$2" 0.99) / $d") mx=$(calc "$(pctl "$2" 1) / $d")
	add "$1p50" "$p50"
	add "$1p99" "$p99"
	add "$1max" "$mx"
	LAG_STATS=("$p50" "$p99" "$mx")
}

# steady_key RATE: the result key prefix of the steady phase at pgbench rate RATE (0: unthrottled).
steady_key() { if [ "$1" = 0 ]; then echo steady; else echo "steady-R$1"; fi; }

# steady_turn C ROUND RATE: one consumer's round at one pgbench rate.
steady_turn() {
	local c=$1 r=$2 rate=$3 k end t_start t_end f stop url hwm='' n
	local -a al=() sl=() fl=() sf=()
	k=$(steady_key "$rate")
	consumer_start "$c" "steady round $r"
	end=$(mark)
	wait_applied "$c" "$end" # it starts at the head, applied and confirmed
	wait_slot "$c" "$end"
	url=$NATIVE_URL
	[ "$c" = native ] || url=$CONV_URL
	sql_open s_src "$SRC"
	sql_open "s_$c" "$url"
	f=$LOGS/$k-$c-$r.lag stop=$TMPD/steady.stop
	rm -f "$f" "$stop"
	sampler "$c" "$f" "$stop" &
	SAMPLER_PID=$!
	t_start=$EPOCHREALTIME
	run_pgbench "$PGBENCH_SECS" "$LOGS/pgbench-$k-$c-$r.log" "$rate"
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
	# Freshness from one second after pgbench started: before its first commits the newest row is
	# an earlier round's.
	awk -v t0="$t_start" -v t="$t_end" '$1 >= t0 + 1 && $1 <= t { print $4 }' "$f" >"$f.fresh"
	awk -v t0="$t_start" -v t="$t_end" '$1 >= t0 + 1 && $1 <= t { print $5 }' "$f" >"$f.srcfresh"
	n=$(wc -l <"$f.bytes")
	[ "$n" -gt 0 ] || bench_die "steady: no lag sample for $c in round $r ($f)"
	[ -s "$f.fresh" ] || bench_die "steady: no freshness sample for $c in round $r ($f)"
	lag_stats "$k|$c|" "$f.bytes"
	al=("${LAG_STATS[@]}")
	lag_stats "$k|$c|slot_" "$f.slot"
	sl=("${LAG_STATS[@]}")
	lag_stats "$k|$c|fresh_" "$f.fresh" 1
	fl=("${LAG_STATS[@]}")
	lag_stats "$k|$c|srcfresh_" "$f.srcfresh" 1
	sf=("${LAG_STATS[@]}")
	add "$k|$c|drain" "$DRAIN_APPLIED"
	add "$k|$c|slot_drain" "$DRAIN_SLOT"
	add "$k|$c|pgbench" "$TPS"
	add "$k|$c|samples" "$n"
	if [ "$c" = conv ]; then
		hwm=$(conv_hwm)
		add "$k|conv|rss" "$(kb_to_mib "$hwm")"
	fi
	printf '   round %s, %-27s applied lag p50 %7.2f MB, p99 %7.2f MB, max %7.2f MB, drain %6.2f s (%s samples), pgbench %.0f tps%s\n' \
		"$r" "${STEADY_LABEL[$c]}:" "${al[@]}" "$DRAIN_APPLIED" "$n" "$TPS" "${hwm:+, peak RSS $(num %.0f "$(kb_to_mib "$hwm")") MiB}"
	printf '   %36s slot lag p50 %7.2f MB, p99 %7.2f MB, max %7.2f MB, drain %6.2f s\n' '' "${sl[@]}" "$DRAIN_SLOT"
	printf '   %36s freshness p50 %6.1f ms, p99 %6.1f ms, max %6.1f ms (source: p50 %.1f, p99 %.1f ms)\n' '' "${fl[@]}" "${sf[0]}" "${sf[1]}"
	consumer_stop "$c"
	consumer_check "$c"
}

# steady_target LABEL KEY METRIC UNIT LIMIT: a summary line for pgconverge/native of METRIC's
# medians (under result key prefix KEY) against LIMIT (a ratio); sets STEADY_X to the ratio. (Not
# in $(…): the summary is this shell's.)
STEADY_X=0
steady_target() {
	local x cv nv
	cv=$(med "$2|conv|$3") nv=$(med "$2|native|$3")
	x=$(ratio "$cv" "$nv")
	target "$1" "$(num %.2fx "$x") ($(num %.2f "$cv") vs $(num %.2f "$nv") $4)" "<= $(num %.2fx "$5")" "$(calc "$cv <= $5 * $nv")"
	STEADY_X=$x
}

# steady_at RATE: the steady phase's rounds and tables at one pgbench rate (0: unthrottled).
steady_at() {
	local rate=$1 k r c x_p99 x_drain x_sp99 x_sdrain x_f50 x_f99 rss what
	k=$(steady_key "$rate")
	what="pgbench -c 4 -j 2 -T $PGBENCH_SECS"
	[ "$rate" = 0 ] || what+=" -R $rate"
	echo
	echo "== steady: each consumer alone streams while $what runs (sampled every $SAMPLE s)"
	for ((r = 1; r <= ROUNDS; r++)); do
		for c in $(ordered "$r" native conv); do steady_turn "$c" "$r" "$rate"; done
	done

	phase_header "steady: lag and freshness while $what runs (sampled every $SAMPLE s), median of $ROUNDS"
	for c in native conv; do
		row "${STEADY_LABEL[$c]}, applied lag p50" "$k|$c|p50" %.2f MB
		row "${STEADY_LABEL[$c]}, applied lag p99" "$k|$c|p99" %.2f MB
		row "${STEADY_LABEL[$c]}, applied lag max" "$k|$c|max" %.2f MB
		row "${STEADY_LABEL[$c]}, applied drain" "$k|$c|drain" %.2f s
		row "${STEADY_LABEL[$c]}, freshness p50" "$k|$c|fresh_p50" %.1f ms
		row "${STEADY_LABEL[$c]}, freshness p99" "$k|$c|fresh_p99" %.1f ms
		row "${STEADY_LABEL[$c]}, freshness max" "$k|$c|fresh_max" %.1f ms
		row "  source's own freshness p50 (the floor)" "$k|$c|srcfresh_p50" %.1f ms
		row "  source's own freshness p99 (the floor)" "$k|$c|srcfresh_p99" %.1f ms
		row "${STEADY_LABEL[$c]}, slot lag p50" "$k|$c|slot_p50" %.2f MB
		row "${STEADY_LABEL[$c]}, slot lag p99" "$k|$c|slot_p99" %.2f MB
		row "${STEADY_LABEL[$c]}, slot lag max" "$k|$c|slot_max" %.2f MB
		row "${STEADY_LABEL[$c]}, slot drain" "$k|$c|slot_drain" %.2f s
		row "${STEADY_LABEL[$c]}, pgbench tps" "$k|$c|pgbench" %.0f
	done
	row "pgconverge peak RSS (VmHWM)" "$k|conv|rss" %.0f MiB
	row "samples per round, native" "$k|native|samples" %.0f
	row "samples per round, pgconverge" "$k|conv|samples" %.0f
	steady_target "$k applied lag p99: pgconv/native" "$k" p99 MB 1
	x_p99=$STEADY_X
	steady_target "$k applied drain: pgconv/native" "$k" drain s 1
	x_drain=$STEADY_X
	steady_target "$k freshness p50: pgconv/native" "$k" fresh_p50 ms 1
	x_f50=$STEADY_X
	steady_target "$k freshness p99: pgconv/native" "$k" fresh_p99 ms 1
	x_f99=$STEADY_X
	steady_target "$k slot lag p99: pgconv/native" "$k" slot_p99 MB 2
	x_sp99=$STEADY_X
	steady_target "$k slot drain: pgconv/native" "$k" slot_drain s 1.5
	x_sdrain=$STEADY_X
	printf '  ratios of medians (lower is better): pgconverge/native applied lag p99 %.2fx, drain %.2fx; freshness p50 %.2fx, p99 %.2fx; slot lag p99 %.2fx, slot drain %.2fx\n' \
		"$x_p99" "$x_drain" "$x_f50" "$x_f99" "$x_sp99" "$x_sdrain" | out
	rss=$(maxof "$(vals "$k|conv|rss")")
	target "peak RSS, $k" "$(num '%.0f MiB' "$rss")" "<= 256 MiB" "$(calc "$rss <= 256")"
}

# phase_steady: the source commits with synchronous_commit = on in this phase (the clusters run
# with fsync = off, so a commit costs no flush): the walsender then sends each commit as soon as
# it is written, as on a production source, not once per WAL writer round (wal_writer_delay,
# 200 ms), which would be most of every contender's freshness.
phase_steady() {
	local rate
	stream_setup
	q "$SRC" "ALTER SYSTEM SET synchronous_commit = on" >/dev/null
	q "$SRC" "SELECT pg_reload_conf()" >/dev/null
	for rate in ${STEADY_RATES//,/ }; do steady_at "$rate"; done
	q "$SRC" "ALTER SYSTEM RESET synchronous_commit" >/dev/null
	q "$SRC" "SELECT pg_reload_conf()" >/dev/null
}
