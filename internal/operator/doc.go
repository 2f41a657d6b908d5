// Package operator holds the operator's commands besides the daemon: the backfill command
// (Backfill), cutover (Cutover), the coverage report (CoverageReport), status (Status) and
// retiring tables (Retire). Each takes a Config whose Validate reports every problem at once, and
// returns a report the CLI prints; none keeps state between calls.
//
// Invariant: a command that writes rows does so through a backfill run (backfillrun.Run), so
// through the one apply step and ledger of the daemon, and the backfill command refuses a target
// that was cut over (coverage.RefuseIfCutOver).
package operator
