// Package apply is the one version-guarded write path into the target: streamed transactions and
// snapshot rows both go through Tx.Apply (a stream group through Tx.ApplyGroup, which pipelines
// it).
//
// Invariant: apply never lowers a row's version, never writes a version at or below the table's
// TRUNCATE fence, and a Tx commits data and the progress LSN (and the ledger rows its caller writes
// on Tx.Conn) in one target transaction (docs/design.md, "The version rule" and "Exactly-once
// effect").
//
// Besides the write path, apply owns the target's shape: EnsureTable creates or reshapes the
// target tables (and EnsureType their types) and registers them in pgconverge.tables with their
// fence, generation and recorded source shape; the progress LSN per slot (ReadProgress,
// SetProgressTx, StartSlot). The coverage ledger (backfill runs, loaded state, membership, spans)
// is package coverage's: apply does not import it, and tells it of a table that must be reloaded
// through a ReloadFunc.
//
// A batch's rows reach one INSERT … ON CONFLICT … DO UPDATE … WHERE (old version) < (new version)
// (PostgreSQL docs, INSERT "ON CONFLICT Clause") inline, as one parameter of record literals, or,
// when large, staged with COPY (text format, PostgreSQL docs §COPY "Text Format") into a
// temporary table (inline.go). Several changes of one key in a batch are first
// collapsed to the newest, keeping earlier values for columns the newest left unchanged.
//
// SyncSequence creates a missing target sequence and moves it forward to a source sequence's
// value, never back.
package apply
