# shellcheck shell=bash
# bench/load.sh — phase `load`: the initial load of pgbench_accounts into a fresh, empty target
# database per attempt (created, CHECKPOINT on both clusters, timed, checked, dropped).

LOAD_TABLE=pgbench_accounts
declare -A LOAD_LABEL=(
	[raw]="raw COPY pipe (ceiling)"
	[native]="native initial sync"
	[conv]="pgconverge backfill (default)"
	[conv1]="pgconverge backfill --workers 1"
	[conv4]="pgconverge backfill --workers 4"
)

# load_attempt C ROUND: one timed initial load by contender C; records rows/s (and peak RSS).
load_attempt() {
	local c=$1 db=load_$1_$2 url t0 secs rc=0 workers=()
	url=$(db_url "$db")
	case $c in
	raw | native) fresh_db "$db" "$LOAD_TABLE" ;;
	*) fresh_db "$db" ;;
	esac
	checkpoint
	case $c in
	raw)
		t0=$EPOCHREALTIME
		"$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -d "$SRC" -c "COPY $LOAD_TABLE TO STDOUT" |
			"$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -d "$url" -c "COPY $LOAD_TABLE FROM STDIN"
		secs=$(calc "$EPOCHREALTIME - $t0")
		;;
	native)
		sql_open load "$url"
		t0=$EPOCHREALTIME
		q "$url" "CREATE SUBSCRIPTION $db CONNECTION '$SRC' PUBLICATION bench_load WITH (copy_data = true)"
		wait_true load "SELECT coalesce((SELECT srsubstate IN ('s', 'r') FROM pg_subscription_rel
			WHERE srrelid = 'public.$LOAD_TABLE'::regclass), false)"
		secs=$(calc "$EPOCHREALTIME - $t0")
		sql_close load
		q "$url" "DROP SUBSCRIPTION $db" # drops its slot on the source too
		;;
	conv*)
		[ "$c" = conv ] || workers=(--workers "${c#conv}")
		t0=$EPOCHREALTIME
		/usr/bin/time -f %M -o "$LOGS/$db.rss" setsid "$BIN" backfill --source "$SRC" --target "$url" \
			--table "public.$LOAD_TABLE" "${workers[@]}" --log-format json \
			>"$LOGS/$db.out" 2>"$LOGS/$db.log" || rc=$?
		secs=$(calc "$EPOCHREALTIME - $t0")
		if [ "$rc" -ne 0 ]; then
			cat "$LOGS/$db.out" >&2
			tail -n 20 "$LOGS/$db.log" >&2
			bench_die "pgconverge backfill ${workers[*]} exited with status $rc (log: $LOGS/$db.log)"
		fi
		add "load|$c|rss" "$(kb_to_mib "$(tail -n 1 "$LOGS/$db.rss")")"
		;;
	esac
	printf '   round %s, %-34s %8.2f s  %10.0f rows/s\n' "$2" "${LOAD_LABEL[$c]}:" "$secs" "$(calc "$N / $secs")"
	if [ "${c:0:4}" = conv ]; then
		check_equal "$url" "NOT _cdc_deleted" "$LOAD_TABLE"
	else
		check_equal "$url" "" "$LOAD_TABLE"
	fi
	q "$TGT_ADMIN" "DROP DATABASE $db WITH (FORCE)"
	add "load|$c|rate" "$(calc "$N / $secs")"
	add "load|$c|secs" "$secs"
}

phase_load() {
	local contenders=(raw native conv) r c rss
	if [ "$LOAD_EXTRA" = 1 ]; then contenders+=(conv1 conv4); fi
	echo
	echo "== load: $N rows of $LOAD_TABLE into an empty target database, $ROUNDS round(s)"
	q "$SRC" "CREATE PUBLICATION bench_load FOR TABLE $LOAD_TABLE"
	for ((r = 1; r <= ROUNDS; r++)); do
		for c in $(ordered "$r" "${contenders[@]}"); do load_attempt "$c" "$r"; done
	done
	q "$SRC" "DROP PUBLICATION bench_load"
	[ "$(q "$SRC" "SELECT count(*) FROM pg_replication_slots")" = 0 ] || bench_die "load: replication slots left on the source"

	phase_header "load: initial load of $LOAD_TABLE ($N rows, scale $SCALE), rows/s, median of $ROUNDS"
	for c in "${contenders[@]}"; do row "${LOAD_LABEL[$c]}" "load|$c|rate" %.0f; done
	for c in "${contenders[@]}"; do
		if [ "${c:0:4}" = conv ]; then row "peak RSS, ${LOAD_LABEL[$c]#pgconverge }" "load|$c|rss" %.0f MiB; fi
	done
	LOAD_X_NATIVE=$(ratio "$(med 'load|conv|rate')" "$(med 'load|native|rate')")
	LOAD_X_RAW=$(ratio "$(med 'load|conv|rate')" "$(med 'load|raw|rate')")
	printf '  ratios of medians: pgconverge/native %.2fx, pgconverge/raw pipe %.2fx\n' "$LOAD_X_NATIVE" "$LOAD_X_RAW" | out
	target "initial load: pgconverge / native" "$(num %.2fx "$LOAD_X_NATIVE") ($(num %.0f "$(med 'load|conv|rate')") vs $(num %.0f "$(med 'load|native|rate')") rows/s)" \
		">= 1.20x" "$(calc "$LOAD_X_NATIVE >= 1.2")"
	rss=$(maxof "$(vals 'load|conv|rss') $(vals 'load|conv1|rss') $(vals 'load|conv4|rss')")
	target "peak RSS, load (every backfill)" "$(num '%.0f MiB' "$rss")" "<= 256 MiB" "$(calc "$rss <= 256")"
}
