package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/spf13/pflag"
)

// addURLFlags defines --source and --target, which default to $PGCONVERGE_SOURCE and
// $PGCONVERGE_TARGET.
func addURLFlags(f *pflag.FlagSet, source, target *string) {
	f.StringVar(source, "source", os.Getenv("PGCONVERGE_SOURCE"), "source PostgreSQL URL ($PGCONVERGE_SOURCE)")
	f.StringVar(target, "target", os.Getenv("PGCONVERGE_TARGET"), "target PostgreSQL URL ($PGCONVERGE_TARGET)")
}

// addPrimaryFlag defines --primary (engine.Config.Primary), which defaults to $PGCONVERGE_PRIMARY,
// shared by the commands that create slots on the source: run, cutover, backfill and verify.
func addPrimaryFlag(f *pflag.FlagSet, primary *string) {
	f.StringVar(primary, "primary", os.Getenv("PGCONVERGE_PRIMARY"), "when --source is a hot standby (PostgreSQL 16 or later), the URL of its primary, where the publication is kept and which is asked to log the running-transactions records a slot's creation on the standby waits for ($PGCONVERGE_PRIMARY); unused while --source is a primary")
}

// validateFormat returns an error naming --format unless format is "table" or "json", the two
// output formats of the report commands; nil otherwise.
func validateFormat(format string) error {
	if format != "table" && format != "json" {
		return fmt.Errorf("--format %q is invalid: use table or json", format)
	}
	return nil
}

// writeJSON writes v to w as indented JSON, the --format json of the report commands.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// addLogFlags defines --log-format and --log-level (see newLogger).
func addLogFlags(f *pflag.FlagSet, format, level *string) {
	f.StringVar(format, "log-format", "auto", "log format: auto (text on a terminal, else json), text or json")
	f.StringVar(level, "log-level", "info", "log level: debug, info, warn or error")
}

// addBackfillFlags defines the flags that size backfills, shared by run and backfill.
func addBackfillFlags(f *pflag.FlagSet, workers, chunkRows *int, snapshotWarn *time.Duration) {
	f.IntVar(workers, "workers", 2, "chunks read and applied in parallel during a backfill (each uses a source and a target connection)")
	f.IntVar(chunkRows, "chunk-rows", 250_000, "rows per chunk, the unit of parallel reading and of resuming; a chunk whose keys the target does not hold is copied in one transaction, else merged batch by batch")
	f.DurationVar(snapshotWarn, "snapshot-warn", 30*time.Minute, "warn when a backfill holds its snapshot longer than this (it holds back VACUUM on the source); 0 never warns")
}

// addSyncSequencesFlag defines --sync-sequences, shared by run and backfill.
func addSyncSequencesFlag(f *pflag.FlagSet, sync *bool) {
	f.BoolVar(sync, "sync-sequences", false, "after a table's backfill completes, sync the sequences it uses to the target as the sequences command does (a point-in-time value: run pgconverge sequences again at cutover)")
}

// addFailoverSlotFlag defines --failover-slot (engine.Config.FailoverSlot), shared by run and
// cutover, whose catch-up streams as run does.
func addFailoverSlotFlag(f *pflag.FlagSet, on *bool) {
	f.BoolVar(on, "failover-slot", true, "on a source of PostgreSQL 17 or later, make the slot a failover slot (FAILOVER), which physical standbys with sync_replication_slots = on keep a copy of, so the daemon continues from a promoted standby with no gap; false creates a plain slot and turns failover off on an existing one; ignored before 17")
}

// addStreamInProgressFlag defines --stream-in-progress (engine.Config.StreamInProgress), shared by
// run and cutover, whose catch-up streams as run does.
func addStreamInProgressFlag(f *pflag.FlagSet, on *bool) {
	f.BoolVar(on, "stream-in-progress", true, "on a source of PostgreSQL 14 or later, have it stream a transaction before its commit once it passes logical_decoding_work_mem (pgoutput protocol 2, 4 from 16): its changes are staged on the target and applied at its commit, and the source spills nothing to its disk; false: the source holds each transaction until its commit")
}

// addStandbyFlag defines --standby (operator.CoverageConfig.Standbys), shared by status and
// coverage.
func addStandbyFlag(f *pflag.FlagSet, urls *[]string) {
	f.StringArrayVar(urls, "standby", nil, "URL of a physical standby of the source (PostgreSQL 17 or later) on which to check that the slot's copy is synced and ready for a failover; repeat for several")
}

// addAuditRetentionFlag adds --audit-retention, shared by run and verify.
func addAuditRetentionFlag(f *pflag.FlagSet, d *time.Duration) {
	f.DurationVar(d, "audit-retention", coverage.DefaultAuditRetention,
		"keep rows of the suppressed-replay audit (pgconverge.suppressed_replays) this long; older ones are deleted (run: hourly, verify: at its end); 0 keeps them forever")
}

// byteSize is a flag value of bytes written with a unit, as "256MiB", "1GB" or "1048576"
// (github.com/dustin/go-humanize: KiB, MiB, GiB are powers of 1024, kB, MB, GB of 1000).
type byteSize int64

// String returns the size in IEC units.
func (b *byteSize) String() string { return humanize.IBytes(uint64(*b)) }

// Set parses s; it returns an error for a size it cannot read or below 16 MiB.
func (b *byteSize) Set(s string) error {
	n, err := humanize.ParseBytes(s)
	if err != nil {
		return fmt.Errorf("%q is not a size (write it as 256MiB, 1GiB or bytes): %w", s, err)
	}
	if n < 16<<20 {
		return fmt.Errorf("%s is below the least budget, 16MiB", s)
	}
	*b = byteSize(n)
	return nil
}

// Type names the value in usage.
func (b *byteSize) Type() string { return "size" }
