// Package engine orchestrates pgconverge: the daemon (Run) and its sessions, backfill runs and
// their workers (Backfill, and the daemon's initial loads, gap and scheduled backfills), sequence
// sync (SyncSequences), and the gathering of the facts a coverage report needs (CoverageReport).
// The CLI (cmd/pgconverge) turns flags into a Config and prints what these return; it provides the
// logger, a Monitor for metrics and a Progress for long work.
//
// Invariant: data flows one way, producer (cdc.Streamer, backfill.ReadChunk) → change batch →
// apply.Tx → target commit (data, progress LSN and ledger rows together) → only then the slot is
// told the position (docs/design.md, "Exactly-once effect"; docs/architecture.md shows the path).
// A session's goroutines run under one errgroup and return typed errors; what the daemon does
// after a failure (stop, back off, restart at once) is decided in one place (decide, retry.go)
// from the marks errors carry from where they are born (internal/disposition) and SQLSTATE
// codes, never from message text.
package engine
