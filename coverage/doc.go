// Package coverage keeps the coverage ledger and computes its gaps: per table, the LSN ranges
// below the watermark that no completed backfill and no stream segment delivered.
//
// Invariant: a range is reported covered only when the ledger proves it; a slot that was lost,
// dropped or moved on without the target, a table that joined the publication late or left the
// selection, a backfill that never completed all leave a gap (DESIGN.md, "Coverage"). Stream
// segments end where the target's committed progress ended (PostgreSQL docs §49.2.1, "Logical
// Replication Slots": a slot guarantees the changes after its confirmed_flush_lsn, and only
// while wal_status is not "lost").
package coverage
