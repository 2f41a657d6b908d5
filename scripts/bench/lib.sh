# shellcheck shell=bash
# bench/lib.sh — helpers for scripts/bench.sh (sourced by it, after common.sh):
#   bench_die MSG          print "bench: MSG" and exit 1 (the EXIT trap cleans up);
#   sql_open NAME URL      a persistent psql session NAME (fifos under ROOT/tmp): polling through
#                          it costs about 0.5 ms, not the ~10 ms of CPU a new psql takes;
#   sql_get NAME SQL       run SQL (one row, one column) in session NAME and print the answer;
#   sql_close NAME         end session NAME;
#   wait_true NAME SQL [S] poll SQL in session NAME every BENCH_POLL s until it returns t (at most
#                          S seconds, default 900); fails at once if WATCH_PID (a daemon) has died
#                          (watch_alive WHAT);
#   check_equal DB-URL WHERE TABLE...  fail loudly unless each TABLE on the target (its source
#                          columns only, rows matching WHERE) has the source's count and md5;
#   add KEY VALUE, vals KEY, med KEY, ratio A B, num FMT X, pctl FILE Q, out (tee to results.txt).
# Results are kept in RES["phase|contender|metric"] as space-separated values, one per round.

bench_die() {
	echo "bench: $*" >&2
	exit 1
}

declare -A SQL_W=() SQL_R=() SQL_PID=() RES=() COLS=() KEYS=()

sql_open() {
	local dir=$TMPD/$1 w r
	mkdir -p "$dir"
	rm -f "$dir/in" "$dir/out"
	mkfifo "$dir/in" "$dir/out"
	PGOPTIONS='-c client_min_messages=warning' "$PGBIN/psql" -X -q -A -t -d "$2" \
		<"$dir/in" >"$dir/out" 2>>"$LOGS/psql-sessions.log" &
	SQL_PID[$1]=$!
	exec {w}>"$dir/in" {r}<"$dir/out"
	SQL_W[$1]=$w SQL_R[$1]=$r
}

sql_get() {
	local line
	[ -n "${SQL_W[$1]:-}" ] || bench_die "no SQL session $1"
	# Writing to a session whose psql is gone would kill this shell with SIGPIPE, silently.
	kill -0 "${SQL_PID[$1]}" 2>/dev/null || bench_die "SQL session $1 has ended (see $LOGS/psql-sessions.log)"
	printf '%s;\n' "$2" >&"${SQL_W[$1]}"
	IFS= read -r -t 60 line <&"${SQL_R[$1]}" ||
		bench_die "session $1 gave no answer to: $2 (see $LOGS/psql-sessions.log)"
	printf '%s\n' "$line"
}

sql_close() {
	local w=${SQL_W[$1]:-} r=${SQL_R[$1]:-}
	[ -n "$w" ] || return 0
	if kill -0 "${SQL_PID[$1]}" 2>/dev/null; then { printf '\\q\n' >&"$w"; } 2>/dev/null || true; fi
	exec {w}>&- {r}<&-
	wait "${SQL_PID[$1]}" 2>/dev/null || true
	unset "SQL_W[$1]" "SQL_R[$1]" "SQL_PID[$1]"
}

sql_close_all() {
	local n
	for n in "${!SQL_W[@]}"; do sql_close "$n"; done
}

WATCH_PID=
# watch_alive WHAT: fail, with the daemon's last log lines, if WATCH_PID is set and has died.
watch_alive() {
	if [ -n "$WATCH_PID" ] && ! kill -0 "$WATCH_PID" 2>/dev/null; then
		tail -n 20 "$LOGS/daemon.log" >&2
		bench_die "pgconverge run (pid $WATCH_PID) died while waiting for: $1 (log: $LOGS/daemon.log)"
	fi
}
wait_true() {
	local start=$SECONDS limit=${3:-900}
	until [ "$(sql_get "$1" "$2")" = t ]; do
		watch_alive "$2"
		((SECONDS - start < limit)) || bench_die "timed out after ${limit} s waiting for: $2"
		sleep "$POLL"
	done
}

# table_meta TABLE: the source's column list and primary key of public.TABLE, into COLS and KEYS.
table_meta() {
	[ -n "${COLS[$1]:-}" ] && return 0
	COLS[$1]=$(q "$SRC" "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute
		WHERE attrelid = 'public.$1'::regclass AND attnum > 0 AND NOT attisdropped")
	KEYS[$1]=$(q "$SRC" "SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY array_position(i.indkey::int2[], a.attnum))
		FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
		WHERE i.indrelid = 'public.$1'::regclass AND i.indisprimary")
	[ -n "${KEYS[$1]}" ] || bench_die "public.$1 has no primary key on the source"
}

# sig URL TABLE [WHERE]: "rows md5" over md5(ROW(source columns)::text) of each row in key order.
sig() {
	PGOPTIONS='-c client_min_messages=warning -c work_mem=256MB' "$PGBIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 -d "$1" -c \
		"SELECT count(*) || ' ' || coalesce(md5(string_agg(md5(ROW(${COLS[$2]})::text), '' ORDER BY ${KEYS[$2]})), '-')
		FROM public.$2 ${3:+WHERE $3}"
}

check_equal() {
	local url=$1 where=$2 t a b pa pb
	shift 2
	for t in "$@"; do
		table_meta "$t"
		sig "$SRC" "$t" >"$TMPD/sig.src" &
		pa=$!
		sig "$url" "$t" "$where" >"$TMPD/sig.tgt" &
		pb=$!
		wait "$pa" || bench_die "could not read public.$t on the source"
		wait "$pb" || bench_die "could not read public.$t on the target ($url)"
		a=$(cat "$TMPD/sig.src") b=$(cat "$TMPD/sig.tgt")
		if [ "$a" != "$b" ]; then
			bench_die "NOT EQUAL: public.$t: source (rows md5) $a, target $b ($url${where:+ WHERE $where})"
		fi
	done
	echo "   equal to the source: $* (${where:-all rows})"
}

# fresh_db NAME [TABLE...]: a new, empty target database, with the source's definition (pg_dump -s:
# columns, primary key) of each TABLE.
fresh_db() {
	local db=$1 t args=()
	shift
	q "$TGT_ADMIN" "DROP DATABASE IF EXISTS $db WITH (FORCE)"
	q "$TGT_ADMIN" "CREATE DATABASE $db"
	for t in "$@"; do args+=(-t "public.$t"); done
	if [ $# -gt 0 ]; then
		"$PGBIN/pg_dump" -s "${args[@]}" "$SRC" | "$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -d "$(db_url "$db")" >/dev/null
	fi
}
db_url() { echo "${TGT_ADMIN/\/postgres\?/\/$1?}"; }
checkpoint() {
	q "$SRC" CHECKPOINT
	q "$TGT_ADMIN" CHECKPOINT
}

# run_pgbench SECONDS LOG [RATE]: pgbench -n -c 4 -j 2 on the source, throttled to RATE
# transactions/s (pgbench -R) when RATE is given and not 0; sets TXNS and TPS.
run_pgbench() {
	local rate=()
	if [ "${3:-0}" != 0 ]; then rate=(-R "$3"); fi
	"$PGBIN/pgbench" -n -c 4 -j 2 "${rate[@]}" -T "$1" "$SRC" >"$2" 2>&1 || { cat "$2" >&2; bench_die "pgbench failed"; }
	TXNS=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$2")
	# shellcheck disable=SC2034 # read by the phases
	TPS=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$2" | head -n 1)
	if [ -z "$TXNS" ] || [ "$TXNS" -eq 0 ]; then bench_die "pgbench processed no transaction ($2)"; fi
}

add() { RES[$1]="${RES[$1]:+${RES[$1]} }$2"; }
vals() { echo "${RES[$1]:-}"; }
med() {
	local v
	v=$(vals "$1")
	[ -n "$v" ] || { echo 0; return; }
	# shellcheck disable=SC2086 # one word per round
	median $v
}
calc() { echo "$1" | bc -l; }
ratio() { if [ "$(calc "$2 == 0")" = 1 ]; then echo 0; else calc "$1 / $2"; fi; }
# shellcheck disable=SC2059 # the format is the caller's
num() { printf "$1" "$2"; }
kb_to_mib() { calc "$1 / 1024"; }
# maxof "X Y ...": the largest number, 0 if none.
# shellcheck disable=SC2086 # one word per number
maxof() { { echo 0; printf '%s\n' $1; } | sort -g | tail -n 1; }
pctl() {
	sort -g "$1" | awk -v q="$2" '{a[NR] = $1} END {
		if (NR == 0) { print 0; exit }
		i = int(q * NR); if (i < q * NR) i++; if (i < 1) i = 1; print a[i] }'
}
out() { tee -a "$RESULTS"; }
rounds_of() { # KEY FMT: every round's value, formatted
	local v s=''
	for v in $(vals "$1"); do s+="$(num "$2" "$v") "; done
	echo "${s% }"
}
# row LABEL KEY FMT [UNIT]: one line of a phase table: contender, median, all rounds.
row() {
	[ -n "$(vals "$2")" ] || return 0
	printf '  %-44s %12s   rounds: %s\n' "$1" "$(num "$3" "$(med "$2")")${4:+ $4}" "$(rounds_of "$2" "$3")" | out
}
# ordered ROUND ITEM...: the items, reversed in even rounds (A,B then B,A).
ordered() {
	local r=$1 i
	shift
	if ((r % 2 == 1)); then echo "$@"; else for ((i = $#; i >= 1; i--)); do printf '%s ' "${!i}"; done; echo; fi
}
phase_header() { printf '\n== %s\n' "$*" | out; }
# target LABEL VALUE TARGET-TEXT MET(1/0): one line of the summary.
SUMMARY=()
target() { SUMMARY+=("$(printf '  %-38s %-34s target %-10s %s' "$1" "$2" "$3" "$([ "$4" = 1 ] && echo met || echo MISSED)")"); }
