// Package coverage keeps the coverage ledger in the target's pgconverge schema and reports its
// gaps: per table, the LSN ranges below the watermark that no completed backfill and no stream
// span delivered, which its pure subpackage gaps computes.
//
// Invariant: a range is reported covered only when the ledger proves it; a slot that was lost,
// dropped or moved on without the target, a table that joined the publication late or left the
// selection, a backfill that never completed all leave a gap (docs/design.md, "Coverage"). Stream
// segments end where the target's committed progress ended (PostgreSQL docs §49.2.1, "Logical
// Replication Slots": a slot guarantees the changes after its confirmed_flush_lsn, and only
// while wal_status is not "lost").
//
// The ledger is every record of what each path delivered: stream segments and table spans
// (ledger.go), backfill runs, table backfills and their chunks with the snapshot LSN S each was
// read at, and the backfill locks (backfills.go), each table's loaded state and publication
// membership (loaded.go), verify runs and their discrepancies (discrepancies.go), and the audit of
// suppressed replays (replays.go), and what the ledger says of each table (tables.go) and of
// running runs (running.go). gaps.Find is a pure function of a gaps.Ledger; NewReport builds the report
// from ReadTables and the Facts the caller gathered from the source. coverage reads and writes
// only the target: it imports neither cdc nor apply, and is handed what the source says.
package coverage
