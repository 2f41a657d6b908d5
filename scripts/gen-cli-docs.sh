#!/usr/bin/env bash
# gen-cli-docs.sh — writes the CLI reference, one Markdown file per command, from the cobra
# commands themselves (help texts and flags) into docs/cli, or into DIR when given.
#
#   scripts/gen-cli-docs.sh [DIR]
#
# It runs `pgconverge gen-docs DIR`, a hidden command that exists only in a binary built with the
# gendocs tag (cmd/pgconverge/gendocs.go), with the PGCONVERGE_* variables unset so that no flag
# default comes from this shell. The output has no date: scripts/test.sh regenerates it into a
# temporary folder and fails when docs/cli differs. Run it after changing a command, flag or help
# text, and commit docs/cli.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then
	export PATH="/usr/local/go/bin:$PATH"
fi

DIR=${1:-docs/cli}
mkdir -p "$DIR"
rm -f "$DIR"/pgconverge*.md
env -u PGCONVERGE_SOURCE -u PGCONVERGE_TARGET -u PGCONVERGE_CONFIG \
	go run -tags gendocs ./cmd/pgconverge gen-docs "$DIR"
