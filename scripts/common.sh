# common.sh — sourced (not run) by demo.sh and the bench*.sh scripts: makes the repository root
# the working directory, puts /usr/local/go/bin on PATH when `go` is missing, and sets
#   REPO       the repository root;
#   PGBIN      PostgreSQL 15's binaries (default /usr/lib/postgresql/15/bin), exported;
#   PGCLUSTER  scripts/pgcluster.sh, which starts and stops the private clusters;
# and the helpers q URL SQL (one psql statement, unaligned tuples only, notices off, stops on an
# error), now (seconds since the epoch, with nanoseconds), since T (seconds from T to now),
# median X... (of numbers), wait_for URL SQL WANT (polls every 0.02 s until SQL returns WANT, at
# most 600 s; an error, such as a table not created yet, counts as not yet) and stop_on_exit (a benchmark's EXIT trap: stops the pgbench whose pid
# is in PGBENCH_PID and the daemon whose pid is in DAEMON_PID, if any, and the clusters `source` and `target` under ROOT, and removes ROOT
# unless PGCONVERGE_KEEP=1).
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then
	export PATH="/usr/local/go/bin:$PATH"
fi
PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
export PGBIN
PGCLUSTER=$REPO/scripts/pgcluster.sh

q() { PGOPTIONS='-c client_min_messages=warning' "$PGBIN/psql" -X -q -A -t -v ON_ERROR_STOP=1 -d "$1" -c "$2"; }
now() { date +%s.%N; }
since() { echo "$(now) - $1" | bc -l; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

wait_for() {
	local start=$SECONDS
	until [ "$(q "$1" "$2" 2>/dev/null)" = "$3" ]; do
		((SECONDS - start < 600)) || { echo "timed out waiting for $2 = $3" >&2; exit 1; }
		sleep 0.02
	done
}

stop_on_exit() {
	local rc=$?
	set +e
	[ -n "${PGBENCH_PID:-}" ] && kill "$PGBENCH_PID" 2>/dev/null
	[ -n "${DAEMON_PID:-}" ] && kill -TERM "$DAEMON_PID" 2>/dev/null && wait "$DAEMON_PID" 2>/dev/null
	"$PGCLUSTER" stop source "$ROOT"
	"$PGCLUSTER" stop target "$ROOT"
	[ "${PGCONVERGE_KEEP:-}" = 1 ] || rm -rf "$ROOT"
	exit "$rc"
}
