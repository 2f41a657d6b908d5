#!/usr/bin/env bash
# test-versions.sh — the version matrix: runs the conformance subset of the integration tests (the
# stream, the backfill's seam with the stream, kill -9, TOAST, DDL following, keyless tables,
# verify, coverage gaps, HA, a source failover, partitions, user types) on a source and a target of each pair of
# PostgreSQL major versions, through scripts/test.sh on clusters of their own. scripts/test.sh
# runs it after the whole suite (on 15) when it is run without arguments.
#
#   scripts/test-versions.sh [PAIR...]   PAIR is MAJOR (source and target) or SOURCE:TARGET;
#                                        default: 14 16 17 18 14:18 15:17 18:16
#
# Environment:
#   PGCONVERGE_TEST_VERSIONS  the pairs when none are given (space-separated; "none" runs nothing)
#   PGCONVERGE_TEST_ROOT      parent of the pairs' cluster folders (default /tmp/pgconverge-test);
#                             each pair uses ROOT-versions-SOURCE-TARGET
#   PGCONVERGE_TEST_PORT      the outer run's source port (default 54341); the pairs use the two
#                             ports 20 above it
# Exit status: 0 when every pair passed, else 1; a line per pair says which failed.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"

# The conformance subset: one or a few tests of each thing a server version can change.
CONFORMANCE=(
	TestStreamInsertUpdateDeleteAndKeyChange TestTruncateThenInsert TestTransactions # stream
	TestTypesRoundTrip TestUserTypesAreCreatedOnTheTarget TestNotNullDomainColumnTakesTombstones
	TestBackfillWhileStreamingUnderLoad TestBackfillWorkedCases # backfill and its seam
	TestCrashAndRestartLosesNothing                             # kill -9
	TestUnchangedToastColumnKeepsItsValue TestKeyChangeCarriesUnchangedToastValue
	TestAddColumnWhileStreaming TestColumnTypeChangeReloadsTheTable TestSlotIsNotConfirmedPastAnUnseenSchemaChange
	TestKeylessTableConverges
	TestVerifyFindsRecordsAndRepairsDrift TestVerifyKeysOfEveryKind
	TestCoverageAfterLoadAndStream TestDroppedSlotIsAGapUntilBackfilled TestInvalidatedSlotIsAGapNotACrashLoop
	TestPublishedGeneratedColumnsAreRefused # PostgreSQL 18 and later
	TestStandbyTakesOverFromAKilledLeader   # HA
	TestPartitionedTableIsOneTargetTable TestSlotIsConfirmedByProbesBetweenFullChecks
)
# Tests of how each version prints schema objects, compared across versions: run on the pairs
# whose source and target differ (14 → 18, 15 → 17, 18 → 16: every major once on one side or the
# other), where a definition printed differently shows.
CROSS_ONLY=(
	TestCutoverCarriesTheSourceSchema TestCopyIndexesFollowsTheSource
)
# Tests of what only the source's version changes (its slots, standbys and walsender): run on the
# pairs whose source and target are the same major, where each source major 14, 16, 17 and 18
# appears once (15 is the whole suite's); the cross pairs run the subset above.
SOURCE_ONLY=(
	TestIdleTimedOutSlotIsAGap                                                                                     # PostgreSQL 18 and later
	TestPromotedStandbyContinuesTheFailoverSlot TestStandbyPromotedBehindTheTargetIsRefused TestStandbySourceIsRefused # source failover (the first from 17 on)
	TestStandbySourceConverges TestStandbySourceWithoutPrimary TestStandbySourceLoadSurvivesARecoveryConflict TestCutoverFromAStandbySource # decoding on a standby (16 and later)
	TestStreamedTransactionIsAppliedAtItsCommit TestStreamedTransactionSurvivesKills TestInterleavedStreamedTransactions TestStreamedTransactionTakesTheGeneralPathPartWay # streaming of in-progress transactions (14 and later)
)
# anchored prints the tests named by its arguments as one anchored go test -run expression.
anchored() {
	local IFS='|'
	echo "^($*)\$"
}

if [ $# -eq 0 ]; then
	# shellcheck disable=SC2206  # split on spaces
	set -- ${PGCONVERGE_TEST_VERSIONS:-14 16 17 18 14:18 15:17 18:16}
fi
[ "${1:-}" = none ] && exit 0

ROOT=${PGCONVERGE_TEST_ROOT:-/tmp/pgconverge-test}
PORT=$((${PGCONVERGE_TEST_PORT:-54341} + 20))
status=0
results=()
for pair in "$@"; do
	src=${pair%%:*}
	tgt=${pair#*:}
	tests=("${CONFORMANCE[@]}")
	if [ "$src" = "$tgt" ]; then
		tests+=("${SOURCE_ONLY[@]}")
	else
		tests+=("${CROSS_ONLY[@]}")
	fi
	echo "== PostgreSQL $src → $tgt: the conformance subset (${#tests[@]} tests)"
	start=$SECONDS
	if PGCONVERGE_TEST_SOURCE_PG=$src PGCONVERGE_TEST_TARGET_PG=$tgt PGCONVERGE_TEST_STATIC=0 \
		PGCONVERGE_TEST_ROOT=$ROOT-versions-$src-$tgt PGCONVERGE_TEST_PORT=$PORT \
		PGCONVERGE_TEST_PACKAGES=./internal/engine scripts/test.sh -run "$(anchored "${tests[@]}")"; then
		results+=("$src → $tgt: passed ($((SECONDS - start)) s)")
	else
		results+=("$src → $tgt: FAILED ($((SECONDS - start)) s)")
		status=1
	fi
done
echo "== version matrix"
printf '%s\n' "${results[@]}"
exit "$status"
