#!/usr/bin/env bash
# pgcluster.sh — start and stop private, throwaway PostgreSQL clusters (15 by default, 14–18 with
# PG_SERVER_VERSION) for pgconverge's demo and
# tests (scripts/demo.sh, scripts/test.sh). Each cluster lives in ROOT/NAME, logs to ROOT/NAME.log,
# listens only on 127.0.0.1 and lets the superuser `postgres` in without a password (trust).
#
# Usage:
#   scripts/pgcluster.sh start   NAME PORT ROOT [logical]  # (re)create and start; idempotent
#   scripts/pgcluster.sh stop    NAME ROOT                 # stop (no error if not running)
#   scripts/pgcluster.sh restart NAME ROOT [MODE]          # pg_ctl restart -m MODE -w: fast (default) or immediate (a crash)
#   scripts/pgcluster.sh url     NAME PORT                 # print the connection URL
#   scripts/pgcluster.sh standby NAME PORT ROOT PRIMARY PRIMARY_PORT  # (re)create and start a physical standby of ROOT/PRIMARY
#   scripts/pgcluster.sh promote NAME ROOT                 # promote standby NAME (pg_ctl promote -w)
#   scripts/pgcluster.sh ensure                            # install PostgreSQL 15 if missing
#
# ROOT is an absolute folder, normally under /tmp (e.g. /tmp/pgconverge-demo); never put it inside
# the repository: CI clones into folders (e.g. under /root) that the server's user cannot read.
# `start` wipes ROOT/NAME first: if a server is running there it is stopped, and an old server that
# holds PORT is stopped too, but only when it is one of ours (its data directory is under ROOT).
# `logical` adds wal_level=logical and room for replication slots, WAL senders and prepared xacts.
# `standby` copies the running cluster ROOT/PRIMARY (PostgreSQL 15 or later; pg_basebackup 15
# cannot copy a newer server, so it uses the low-level backup API, pg_backup_start and
# pg_backup_stop, PostgreSQL docs §26.3.3) into ROOT/NAME, after creating the physical slot NAME
# (lower-cased, - made _) on the primary, and starts it streaming from it with primary_slot_name,
# hot_standby_feedback and, from PostgreSQL 17 on, sync_replication_slots (dbname=postgres in
# primary_conninfo): the settings a standby needs to keep copies of failover slots. Stop it with
# `stop NAME ROOT`; its physical slot stays on the primary until dropped there.
#
# PostgreSQL refuses to run as root. When this script runs as root, every server-side command runs
# as the OS user `postgres` (or, if that user does not exist, a system user `pgconverge` that is
# created on demand) via `runuser -u USER --`; when not root, commands run as the current user.
# If the PostgreSQL 15 binaries are missing, `apt-get install postgresql-15 postgresql-client-15`
# is attempted (as root, or via sudo).
#
# Environment:
#   PGBIN              PostgreSQL 15's binaries (default /usr/lib/postgresql/15/bin): the client
#                      programs (psql, pg_isready) of every cluster, and 15's server
#   PG_SERVER_VERSION  the major version `start` creates (default 15); 14, 16, 17 and 18 come from
#                      scripts/pgservers.sh, which downloads its pinned build once. `stop` and
#                      `restart` run the binaries of the version the data directory holds.
set -euo pipefail

PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
PGSERVERS=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/pgservers.sh
# SERVERBIN is the folder of initdb, pg_ctl and postgres of the cluster at hand (server_bin).
SERVERBIN=$PGBIN
# Every path this script touches is absolute; working from / also keeps tools that look at the
# current directory happy when it is one the server's user cannot read (e.g. /root).
SELF=$(readlink -f "${BASH_SOURCE[0]}")
cd /

die() {
	echo "pgcluster: $*" >&2
	exit 1
}
say() { echo "pgcluster: $*" >&2; }

is_root() { [ "$(id -u)" -eq 0 ]; }

# ensure_binaries installs PostgreSQL 15 when one of the binaries we use is missing.
ensure_binaries() {
	local b missing=()
	for b in initdb pg_ctl postgres pg_isready psql pgbench; do
		[ -x "$PGBIN/$b" ] || missing+=("$b")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	say "missing in $PGBIN: ${missing[*]}; installing postgresql-15 postgresql-client-15"
	local sudo=()
	if ! is_root; then
		command -v sudo >/dev/null || die "not root and no sudo: install postgresql-15 and postgresql-client-15"
		sudo=(sudo)
	fi
	"${sudo[@]}" apt-get update
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql-15 postgresql-client-15
	for b in "${missing[@]}"; do
		[ -x "$PGBIN/$b" ] || die "$PGBIN/$b still missing after installing PostgreSQL 15"
	done
}

# server_bin MAJOR sets SERVERBIN to MAJOR's server binaries, installing them if needed.
server_bin() {
	case $1 in
	15) SERVERBIN=$PGBIN ;;
	14 | 16 | 17 | 18) SERVERBIN=$(PGBIN=$PGBIN "$PGSERVERS" bin "$1") || die "no PostgreSQL $1 server binaries" ;;
	*) die "PostgreSQL $1 is not supported here (14, 15, 16, 17 or 18)" ;;
	esac
}

# data_server_bin DATA sets SERVERBIN to the binaries of the version in data directory DATA.
data_server_bin() {
	if [ -f "$1/PG_VERSION" ]; then
		server_bin "$(cat "$1/PG_VERSION")"
	fi
}

# PG_USER is the OS user that owns and runs the clusters.
PG_USER=
pick_user() {
	if ! is_root; then
		PG_USER=$(id -un)
	elif id -u postgres >/dev/null 2>&1; then
		PG_USER=postgres
	else
		if ! id -u pgconverge >/dev/null 2>&1; then
			say "creating system user pgconverge to run PostgreSQL (it refuses to run as root)"
			useradd --system --user-group --home-dir /nonexistent --no-create-home \
				--shell /usr/sbin/nologin pgconverge
		fi
		PG_USER=pgconverge
	fi
}

# as_pg runs a command as PG_USER.
as_pg() {
	if is_root; then
		runuser -u "$PG_USER" -- "$@"
	else
		"$@"
	fi
}

check_name() { [[ $1 =~ ^[A-Za-z0-9_-]+$ ]] || die "bad cluster NAME '$1' (use letters, digits, _ and -)"; }
check_port() {
	if ! [[ $1 =~ ^[0-9]+$ ]] || [ "$1" -lt 1024 ] || [ "$1" -gt 65535 ]; then
		die "bad PORT '$1' (1024..65535)"
	fi
}
# check_root validates ROOT (it is used in `rm -rf ROOT/NAME` and in the server config) and strips
# trailing slashes.
check_root() {
	local r=$1
	while [ "${#r}" -gt 1 ] && [ "${r%/}" != "$r" ]; do r=${r%/}; done
	case $r in
	/*) ;;
	*) die "ROOT must be an absolute path (got '$1')" ;;
	esac
	[ "$r" != / ] || die "ROOT must not be /"
	case $r in
	*"'"* | *"\\"* | *" "*) die "ROOT must not contain quotes, backslashes or spaces: $r" ;;
	esac
	case /$r/ in
	*/../* | */./*) die "ROOT must be a normalized path (no . or ..): $r" ;;
	esac
	ROOT=$r
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# server_running tells whether a postmaster is alive in data directory $1.
server_running() {
	[ -f "$1/postmaster.pid" ] || return 1
	data_server_bin "$1"
	as_pg "$SERVERBIN/pg_ctl" -D "$1" status >/dev/null 2>&1
}

# listen_inodes prints the socket inodes of the IPv4 TCP sockets listening on port $1.
listen_inodes() {
	local hex
	hex=$(printf '%04X' "$1")
	# /proc/net/tcp: "sl local_address rem_address st ... inode"; st 0A is LISTEN.
	awk -v p=":$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { print $10 }' /proc/net/tcp 2>/dev/null || true
}

# orphan_postmasters ROOT [NAME [PORT]] prints the PIDs of postmasters that ran in a data directory
# under ROOT (ROOT/NAME if NAME is not empty) that has since been deleted, e.g. because ROOT was
# removed while the server was still running. They are ours and serve nothing, and pg_ctl cannot
# reach them any more. With PORT, only the one listening on PORT is printed.
orphan_postmasters() {
	local root=$1 name=${2:-} port=${3:-} d cwd argv0 inodes='' ino found
	if [ -n "$port" ]; then
		inodes=$(listen_inodes "$port")
		[ -n "$inodes" ] || return 0
	fi
	for d in /proc/[0-9]*; do
		cwd=$(readlink "$d/cwd" 2>/dev/null) || continue
		case $cwd in
		"$root"/*" (deleted)") ;;
		*) continue ;;
		esac
		if [ -n "$name" ] && [ "$cwd" != "$root/$name (deleted)" ]; then
			continue
		fi
		# A postmaster keeps its command line (.../postgres -D DIR); its children rewrite theirs.
		argv0=$(tr '\0' '\n' <"$d/cmdline" 2>/dev/null | head -n 1) || continue
		case $argv0 in
		*/postgres | postgres) ;;
		*) continue ;;
		esac
		if [ -n "$port" ]; then
			found=no
			for ino in $inodes; do
				if find "$d/fd" -lname "socket:\[$ino\]" 2>/dev/null | grep -q .; then
					found=yes
				fi
			done
			[ "$found" = yes ] || continue
		fi
		echo "${d#/proc/}"
	done
}

# kill_orphans ROOT [NAME [PORT]] stops what orphan_postmasters finds (immediate shutdown).
kill_orphans() {
	local pid pids i alive
	pids=$(orphan_postmasters "$@")
	[ -n "$pids" ] || return 0
	for pid in $pids; do
		say "stopping orphaned postmaster $pid (its data directory under $1 was deleted)"
		kill -QUIT "$pid" 2>/dev/null || true
	done
	for i in $(seq 1 100); do
		alive=''
		for pid in $pids; do
			if kill -0 "$pid" 2>/dev/null; then
				alive="$alive $pid"
			fi
		done
		[ -n "$alive" ] || return 0
		if [ "$i" -eq 50 ]; then
			for pid in $alive; do kill -KILL "$pid" 2>/dev/null || true; done
		fi
		sleep 0.1
	done
	die "could not stop orphaned postmaster(s):$alive"
}

stop_dir() { # DATA [MODE]
	if server_running "$1"; then
		as_pg "$SERVERBIN/pg_ctl" -D "$1" -m "${2:-fast}" -w -t 120 -s stop
	fi
}

wait_ready() { # PORT LOG
	local i
	for i in $(seq 1 120); do
		if "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$1" -U postgres -d postgres; then
			return 0
		fi
		sleep 0.5
	done
	tail -n 30 "$2" >&2 || true
	die "server on port $1 did not become ready within 60 s (log: $2)"
}

start_server() { # DATA LOG PORT: starts the server of data directory DATA (SERVERBIN's) and waits for it
	as_pg "$SERVERBIN/pg_ctl" -D "$1" -l "$2" -w -t 60 -s start </dev/null || {
		tail -n 30 "$2" >&2 || true
		die "could not start $1 (log: $2)"
	}
	wait_ready "$3" "$2"
}

cmd_start() {
	local name=$1 port=$2 mode=${4:-}
	check_name "$name"
	check_port "$port"
	check_root "$3"
	case $mode in
	"" | logical) ;;
	*) die "start: 4th argument must be 'logical' or absent (got '$mode')" ;;
	esac
	local data=$ROOT/$name log=$ROOT/$name.log
	# Unix socket paths are limited to 107 bytes.
	[ "${#data}" -le 90 ] || die "ROOT/NAME is too long for a Unix socket directory: $data"
	ensure_binaries
	pick_user

	# Idempotence: stop whatever runs in our data directory, then wipe it.
	stop_dir "$data" immediate
	kill_orphans "$ROOT" "$name"
	rm -rf "$data" "$log"

	# Somebody else on the port? Stop it only if it is one of our clusters under ROOT.
	if port_busy "$port"; then
		local pidfile dir i
		for pidfile in "$ROOT"/*/postmaster.pid; do
			[ -f "$pidfile" ] || continue
			dir=${pidfile%/postmaster.pid}
			if [ "$(sed -n 4p "$pidfile")" = "$port" ] && server_running "$dir"; then
				say "stopping our old server in $dir that holds port $port"
				stop_dir "$dir" fast
			fi
		done
		if port_busy "$port"; then
			kill_orphans "$ROOT" "" "$port"
		fi
		# A stopped server's port can take a moment to be released.
		for i in $(seq 1 25); do
			port_busy "$port" || break
			sleep 0.2
		done
		if port_busy "$port"; then
			die "port $port on 127.0.0.1 is in use by something that is not one of our clusters under $ROOT"
		fi
	fi

	server_bin "${PG_SERVER_VERSION:-15}"
	mkdir -p "$ROOT" "$data"
	if is_root; then
		# The server's user must be able to reach ROOT and own its data directory and log.
		chmod go+rx "$ROOT"
		as_pg test -x "$ROOT" || die "user $PG_USER cannot enter $ROOT (check the permissions of its parents)"
		touch "$log"
		chown "$PG_USER:" "$data" "$log"
	fi
	chmod 700 "$data"

	local locale=C
	if locale -a 2>/dev/null | grep -qiE '^c\.utf-?8$'; then
		locale=C.UTF-8
	fi
	as_pg "$SERVERBIN/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --locale="$locale" \
		--no-sync --no-instructions >"$data.initdb.log" 2>&1 || {
		cat "$data.initdb.log" >&2
		die "initdb failed for $data"
	}
	rm -f "$data.initdb.log"

	{
		echo
		echo "# ---- pgconverge private cluster '$name' (written by scripts/pgcluster.sh) ----"
		echo "# This is a private, throwaway cluster for the demo and tests: fsync, synchronous_commit"
		echo "# and full_page_writes are OFF for speed, so a crash can lose or corrupt data."
		echo "# Never copy these settings to a server whose data matters."
		echo "listen_addresses = '127.0.0.1'"
		echo "port = $port"
		echo "unix_socket_directories = '$data'"
		# Room for the integration tests that run at once (scripts/test.sh's -parallel): each
		# holds its own connections and those of one to three daemons (source: queries,
		# replication, backfill workers and snapshot slots; target: apply, leader lock, presence).
		echo "max_connections = 500"
		echo "fsync = off"
		echo "synchronous_commit = off"
		echo "full_page_writes = off"
		if [ "$mode" = logical ]; then
			echo "wal_level = logical"
			echo "max_replication_slots = 120"
			echo "max_wal_senders = 120"
			echo "max_prepared_transactions = 20"
		fi
	} | as_pg tee -a "$data/postgresql.conf" >/dev/null

	start_server "$data" "$log" "$port"
	say "started '$name' (PostgreSQL ${PG_SERVER_VERSION:-15}) on 127.0.0.1:$port${mode:+ ($mode)}, data $data, log $log"
}

cmd_stop() {
	local name=$1
	check_name "$name"
	check_root "$2"
	local data=$ROOT/$name
	if [ -d "$data" ]; then
		pick_user
		stop_dir "$data" fast
	fi
	kill_orphans "$ROOT" "$name"
}

cmd_restart() {
	local name=$1 mode=${3:-fast}
	check_name "$name"
	check_root "$2"
	case $mode in fast | immediate) ;; *) die "restart mode must be fast or immediate, not '$mode'" ;; esac
	local data=$ROOT/$name log=$ROOT/$name.log
	[ -f "$data/PG_VERSION" ] || die "no cluster in $data (use start first)"
	pick_user
	data_server_bin "$data"
	# -l: keep logging to the file; without it the server would inherit our stdout/stderr.
	as_pg "$SERVERBIN/pg_ctl" -D "$data" -l "$log" -m "$mode" -w -t 120 -s restart </dev/null || {
		tail -n 30 "$log" >&2 || true
		die "could not restart $data (log: $log)"
	}
	wait_ready "$(sed -n 4p "$data/postmaster.pid")" "$log"
}

# slot_of NAME prints the physical slot name of standby NAME: lower case, - made _.
slot_of() { echo "$1" | tr 'A-Z-' 'a-z_'; }

cmd_standby() {
	local name=$1 port=$2 primary=$4 pport=$5
	check_name "$name"
	check_name "$primary"
	check_port "$port"
	check_port "$pport"
	check_root "$3"
	[ "$name" != "$primary" ] || die "standby: NAME and PRIMARY must differ"
	local data=$ROOT/$name log=$ROOT/$name.log pdata=$ROOT/$primary slot major purl
	slot=$(slot_of "$name")
	pick_user
	server_running "$pdata" || die "standby: no running cluster in $pdata"
	major=$(cat "$pdata/PG_VERSION")
	[ "$major" -ge 15 ] || die "standby: the primary runs PostgreSQL $major; the low-level backup API used here (pg_backup_start) needs 15 or later"
	stop_dir "$data" immediate
	kill_orphans "$ROOT" "$name"
	rm -rf "$data" "$log"
	if port_busy "$port"; then
		die "port $port on 127.0.0.1 is in use"
	fi
	purl=$(cmd_url "$primary" "$pport")
	"$PGBIN/psql" -X -q -v ON_ERROR_STOP=1 -d "$purl" \
		-c "select pg_drop_replication_slot(slot_name) from pg_replication_slots where slot_name = '$slot'" \
		-c "select pg_create_physical_replication_slot('$slot', true)" >/dev/null
	mkdir -p "$data"
	if is_root; then
		touch "$log"
		chown "$PG_USER:" "$data" "$log"
	fi
	chmod 700 "$data"
	# One psql session holds the backup open while \! copies the data directory (files may change
	# or vanish meanwhile: tar's exit status 1 says so, and replaying the WAL from the backup's
	# start repairs them), then writes backup_label and tablespace_map from pg_backup_stop.
	local script=$ROOT/$name.backup.sql out=$ROOT/$name.backup.log
	{
		echo "select pg_backup_start('pgcluster standby $name', true);"
		printf '%s\n' "\\! tar -C $pdata --exclude=./postmaster.pid --exclude=./postmaster.opts --exclude='./pg_wal/*' --exclude='./pg_replslot/*' --exclude='./pg_stat_tmp/*' --exclude=./backup_label --exclude=./standby.signal --ignore-failed-read --warning=no-file-changed --warning=no-file-removed -cf - . | tar -C $data -xf -; [ \$? -le 1 ] || echo COPY-FAILED"
		echo "create temp table b as select * from pg_backup_stop(true);"
		echo "select labelfile from b \\g $data/backup_label"
		echo "select coalesce(spcmapfile, '') from b \\g $data/tablespace_map"
	} >"$script"
	chmod go+r "$script"
	if ! as_pg "$PGBIN/psql" -X -q -At -v ON_ERROR_STOP=1 -d "$purl" -f "$script" >"$out" 2>&1 || grep -q COPY-FAILED "$out"; then
		cat "$out" >&2
		die "standby: the backup of $pdata into $data failed"
	fi
	rm -f "$script" "$out"
	as_pg mkdir -p "$data/pg_wal/archive_status"
	[ -s "$data/tablespace_map" ] && grep -q . "$data/tablespace_map" || rm -f "$data/tablespace_map"
	{
		echo
		echo "# ---- standby '$name' of '$primary' (written by scripts/pgcluster.sh standby) ----"
		echo "port = $port"
		echo "unix_socket_directories = '$data'"
		echo "primary_conninfo = 'host=127.0.0.1 port=$pport user=postgres dbname=postgres application_name=$name'"
		echo "primary_slot_name = '$slot'"
		echo "hot_standby = on"
		echo "hot_standby_feedback = on"
		if [ "$major" -ge 17 ]; then
			echo "sync_replication_slots = on"
		fi
	} | as_pg tee -a "$data/postgresql.conf" >/dev/null
	as_pg touch "$data/standby.signal"
	server_bin "$major"
	start_server "$data" "$log" "$port"
	say "started standby '$name' (PostgreSQL $major) of '$primary' on 127.0.0.1:$port, physical slot $slot on the primary, data $data, log $log"
}

cmd_promote() {
	local name=$1
	check_name "$name"
	check_root "$2"
	local data=$ROOT/$name
	[ -f "$data/standby.signal" ] || die "promote: $data is no standby (no standby.signal)"
	pick_user
	data_server_bin "$data"
	as_pg "$SERVERBIN/pg_ctl" -D "$data" -w -t 60 -s promote || die "could not promote $data (log: $ROOT/$name.log)"
}

cmd_url() {
	check_name "$1"
	check_port "$2"
	printf 'postgres://postgres@127.0.0.1:%s/postgres?sslmode=disable\n' "$2"
}

usage() {
	sed -n '2,/^set -euo/p' "$SELF" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2
	exit 2
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case $cmd in
start) [ $# -eq 3 ] || [ $# -eq 4 ] || usage; cmd_start "$@" ;;
stop) [ $# -eq 2 ] || usage; cmd_stop "$@" ;;
restart) [ $# -eq 2 ] || [ $# -eq 3 ] || usage; cmd_restart "$@" ;;
url) [ $# -eq 2 ] || usage; cmd_url "$@" ;;
standby) [ $# -eq 5 ] || usage; cmd_standby "$@" ;;
promote) [ $# -eq 2 ] || usage; cmd_promote "$@" ;;
ensure) [ $# -eq 0 ] || usage; ensure_binaries; pick_user ;;
*) usage ;;
esac
