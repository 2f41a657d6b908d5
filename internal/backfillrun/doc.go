// Package backfillrun runs backfills: one run (Run, a Job) reads every chunk of every table from
// one exact snapshot with several workers in parallel and applies each chunk through the one
// version-guarded apply step (apply.Tx) in a target transaction together with its ledger row, so
// a run that stops resumes from its completed chunks, and processes that join a run (Join) take
// its unclaimed chunks. The daemon's initial loads, gap and scheduled backfills and `pgconverge
// backfill` are all such runs.
//
// Invariant: a chunk's rows and its completion commit together, at version (S, 0) where S is the
// run's exact snapshot LSN (the consistent point of a temporary logical replication slot,
// PostgreSQL docs "Replication Protocol", CREATE_REPLICATION_SLOT … EXPORT_SNAPSHOT), so the
// ledger never records a chunk the target lacks and a replayed chunk changes nothing.
package backfillrun
