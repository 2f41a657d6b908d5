package engine

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/internal/backfillrun"
	"github.com/pgconverge/pgconverge/internal/lease"
	"github.com/pgconverge/pgconverge/internal/pacing"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/internal/schedule"
	"github.com/pgconverge/pgconverge/internal/verify"
	"github.com/robfig/cron/v3"
)

// DefaultMemoryBudget is Config.MemoryBudget's default: 256 MiB.
const DefaultMemoryBudget = 256 << 20

// Config configures the daemon (Run): what `pgconverge run` takes from its flags.
type Config struct {
	Source, Target string
	// Primary is the URL of the primary when Source is a hot standby (PostgreSQL 16 and later):
	// the publication is created and changed there, and while a slot is created on the standby
	// the primary is asked for running-transactions records (pg_log_standby_snapshot). "" with a
	// standby source: the publication must exist, and slots wait for the primary's own records.
	// Unused while Source is not in recovery (a standby promoted since, say).
	Primary string
	// Tables are comma-separated lists of "schema.table" names (changebatch.ParseTableList); empty
	// means the default selection (cdc.DefaultTables).
	Tables      []string
	Slot        string
	Publication string
	// StreamInProgress asks a source of PostgreSQL 14 or later to stream transactions before they
	// commit (pgoutput streaming, protocol 2, 4 from 16) once they pass its
	// logical_decoding_work_mem: their changes are staged on the target as they come
	// (package staging) and applied at their commit, so the source spills nothing to its disk and
	// the commit is applied without waiting for the whole transaction to be decoded. Off, the
	// source holds each transaction until its commit.
	StreamInProgress bool
	// FailoverSlot makes the slot a failover slot on a source of PostgreSQL 17 or later (created
	// with FAILOVER, or an existing slot altered to it; false alters it back): physical standbys
	// that sync replication slots keep a copy, so a promoted standby continues the stream with no
	// gap (docs/high-availability.md). It does nothing on older sources.
	FailoverSlot bool
	// BackfillWorkers chunks are read and applied at once during a backfill; ChunkRows rows make a
	// chunk (one target transaction).
	BackfillWorkers, ChunkRows int
	// ChunkTimeCap bounds one read of the source by a backfill (backfillrun.Job.ChunkTimeCap);
	// 0 reads each chunk in one statement.
	ChunkTimeCap time.Duration
	// SnapshotWarn is how long a backfill may hold its snapshot before it warns; 0 never warns.
	SnapshotWarn time.Duration
	// BackfillSchedule, when set, backfills every selected table again at its ticks while
	// streaming (schedule.Parse, schedule.Backfills).
	BackfillSchedule cron.Schedule
	// SnapshotSchedule, when set, backfills the tables kept by snapshots only
	// (changebatch.Table.SnapshotOnly) again at its ticks, each read whole at one snapshot;
	// `run --snapshot-schedule` defaults to @hourly. They are loaded when a session starts
	// and they never completed a load, whatever the schedule.
	SnapshotSchedule cron.Schedule
	// VerifySchedule, when set, verifies every selected table at its ticks while streaming
	// (Verify, trigger "schedule"), and with VerifyRepair repairs what it finds.
	VerifySchedule cron.Schedule
	VerifyRepair   bool
	// AuditRetention is how long rows of the suppressed-replay audit
	// (pgconverge.suppressed_replays) are kept: older ones are deleted when a session starts and
	// hourly. 0 keeps them forever; `run --audit-retention` defaults to
	// coverage.DefaultAuditRetention.
	AuditRetention time.Duration
	// LiveSuffix, when set, names the schemas of the live views the daemon keeps over the target
	// tables (apply.EnsureLiveView): public.orders gets public<LiveSuffix>.orders, its live rows
	// without metadata columns. `run --live-suffix` defaults to "_live"; "" keeps no views.
	LiveSuffix string
	// TombstoneRetention is how long tombstones are kept at least after the stream applied them;
	// older ones are deleted hourly once no path can deliver a change they guard against
	// (tombstonePruner, coverage.TombstoneHorizon). 0 keeps them forever; `run
	// --tombstone-retention` defaults to 24h.
	TombstoneRetention time.Duration
	// MemoryBudget bounds, in bytes, the change data the stream holds: the group being applied
	// and the next one, each at most a sixteenth of it (cdc.StreamConfig.MaxPendingBytes), so
	// that the Arrow buffers' growth, staging and the Go runtime fit in the rest. A source transaction larger than a group
	// is applied in parts (cdc.StreamConfig.MaxPendingBytes). 0 means 256 MiB. The process-wide
	// limit (runtime/debug.SetMemoryLimit) is the caller's.
	MemoryBudget int64
	// OnGap is what the daemon does with a table whose coverage has a gap at the start of a
	// session: OnGapRepair repairs it by comparison before streaming (only the keys that differ
	// at the new snapshot are written; a table it cannot compare is backfilled), OnGapBackfill
	// backfills it before streaming, OnGapAlert only reports it.
	OnGap string
	// CopyIndexes builds the source's secondary indexes on each target table once it is loaded,
	// and follows the source's new and dropped indexes (indexFollower, every minute); a unique
	// index or constraint gets a twin without its uniqueness until cutover --finalize.
	CopyIndexes bool
	// Limits are the rate limits of the daemon's backfills and verifies (`run
	// --max-rows-per-second`, `--max-bytes-per-second`), each counted apart; the daemon records
	// them in the ledger when it starts, where `backfill --set` and a SIGHUP reload change them
	// while it runs (package control).
	Limits pacing.Limits
	// WALBudget is how many bytes of WAL the slot may hold before the daemon acts (walBudget):
	// from half of it backfills and verifies wait for the stream to catch up, from 80% it warns
	// and resumes a stream the operator paused. 0 takes max_slot_wal_keep_size, or
	// DefaultWALBudget when the source keeps WAL for slots without limit; a budget above
	// max_slot_wal_keep_size is lowered to it.
	WALBudget int64
	// Pacing, when enabled, makes backfills and verifies wait while the source is under load
	// (LoadLimits).
	Pacing LoadLimits
	// SyncSequences syncs the sequences of each table after each completed backfill run of it
	// (initial load, gap and scheduled backfills; sequences.SyncAfterBackfill).
	SyncSequences bool
	// Logger receives the daemon's log lines; Monitor its counters and gauges (nil: none, and the
	// daemon then skips the source reads that only feed metrics).
	Logger  *slog.Logger
	Monitor Monitor
	Knobs   Knobs
	// pace is the daemon's pacers and stream pause (daemonPace), which Run makes for its life.
	pace *daemonPace
	// copyOnly is the daemon's set of tables staged by COPY only (apply.CopyOnlyTables), which
	// Run makes and every Applier of its sessions, their backfills and fills shares.
	copyOnly *apply.CopyOnlyTables
}

// On-gap policies of Config.OnGap (`run --on-gap`).
const (
	OnGapRepair   = "repair"
	OnGapBackfill = "backfill"
	OnGapAlert    = "alert"
)

// Knobs are fault-injection hooks for tests; nil hooks do nothing.
type Knobs struct {
	Stream cdc.Knobs
	// AfterLoadChunk runs after each committed chunk of an initial load, with the table's rows
	// loaded so far; BeforeGapRepairBatch before each write transaction of a gap repair
	// (--on-gap=repair), with the table's rows written so far.
	AfterLoadChunk       func(table string, rows int64)
	BeforeGapRepairBatch func(table string, written int64)
	// BeforeStreamedCommit runs after a streamed transaction's staged rows were merged, before
	// the target transaction commits.
	BeforeStreamedCommit func()
	// Schedule runs at each event of a scheduled backfill tick (schedule.Backfills.OnEvent);
	// AfterScheduledChunk after each committed chunk of a scheduled backfill.
	Schedule            func(schedule.Event)
	AfterScheduledChunk func(table string, rows int64)
	// Verified runs after each scheduled verify with its report and error
	// (schedule.Verifies.Verified).
	Verified func(verify.Report, error)
	// ControlEvery, when set, replaces controlEvery; SourceLoadEvery replaces sourceLoadEvery.
	ControlEvery, SourceLoadEvery time.Duration
	// IndexFollowEvery, when set, replaces indexFollowEvery.
	IndexFollowEvery time.Duration
	// TombstonePruneEvery, when set, replaces tombstonePruneEvery.
	TombstonePruneEvery time.Duration
	// StatusInterval, when set, replaces the stream's status interval (10 s), which also sets how
	// soon a silent source connection is given up (cdc.ErrSourceSilent).
	StatusInterval time.Duration
	// StatementTimeout, when set, replaces statementTimeout. BeforePreflight runs before a
	// session's checks (preflight); BeforeStep before each step of a session's start, named
	// "connect", "describe", "lead", "prepare-target", "publication", "slot" and "stream".
	StatementTimeout time.Duration
	BeforePreflight  func()
	BeforeStep       func(step string)
	// PresenceCheckEvery, when set, replaces overlap.PresenceCheckEvery.
	PresenceCheckEvery time.Duration
	// RetryBackoffMax, when set, replaces the 20 s cap of the backoff between a failed session and
	// the next (Run).
	RetryBackoffMax time.Duration
	// OverlapGrace, when set, replaces overlap.Grace; OverlapPoll replaces overlap.Poll.
	OverlapGrace time.Duration
	OverlapPoll  time.Duration
	// FullCheckEvery, when set, replaces fullCheckEvery, how often the catalog watcher checks the
	// catalog in full; AfterCatalogCheck runs after each of its checks that found nothing
	// changed, with whether it was a full one.
	FullCheckEvery    time.Duration
	AfterCatalogCheck func(full bool)
	// BeforeFenced runs right before a change the leader makes only while it holds its epoch
	// (fence.go), naming it: "schema" (a session start's target tables, types and live views),
	// "key " and the table (a bulk load's key deferral), "publication" (adding tables to it),
	// "publication commit" (after that change, before its check and commit).
	BeforeFenced func(change string)
	// Lease, when set, replaces the lease's timings (lease.Default): the leader lock's checks, a
	// standby's and an epoch raise's wait for a silent holder, the backfill processes' lease of
	// the daemon's runs and its watch of other backfill processes. Each unset duration stays the
	// production one (lease.Timings.OrDefault).
	Lease lease.Timings
}

// leaseTimings returns the lease's timings: Lease's, the production ones where unset.
func (k Knobs) leaseTimings() lease.Timings {
	return k.Lease.OrDefault()
}

// knobOr returns knob when it is set (positive), else the production value def.
func knobOr(knob, def time.Duration) time.Duration {
	if knob > 0 {
		return knob
	}
	return def
}

// beforeFenced runs BeforeFenced, when set, with change.
func (k Knobs) beforeFenced(change string) {
	if k.BeforeFenced != nil {
		k.BeforeFenced(change)
	}
}

// Validate reports every problem of the configuration at once, naming the flag to fix.
func (c *Config) Validate() error {
	errs := pgsession.ValidateURLs(c.Source, c.Target)
	if err := cdc.ValidateSlotName(c.Slot); err != nil {
		errs = append(errs, err)
	}
	if err := cdc.ValidatePublicationName(c.Publication); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, backfillrun.ValidateSizes(c.BackfillWorkers, c.ChunkRows, c.SnapshotWarn))
	if c.OnGap != OnGapRepair && c.OnGap != OnGapBackfill && c.OnGap != OnGapAlert {
		errs = append(errs, fmt.Errorf("--on-gap %q is invalid: use %s, %s or %s", c.OnGap, OnGapRepair, OnGapBackfill, OnGapAlert))
	}
	if c.MemoryBudget < 0 {
		errs = append(errs, fmt.Errorf("--memory-budget %d is negative", c.MemoryBudget))
	}
	if c.Limits.RowsPerSecond < 0 || c.Limits.BytesPerSecond < 0 {
		errs = append(errs, errors.New("--max-rows-per-second and --max-bytes-per-second cannot be negative: use 0 for no limit"))
	}
	if c.ChunkTimeCap < 0 {
		errs = append(errs, fmt.Errorf("--chunk-time-cap %s is negative: use 0 for no cap", c.ChunkTimeCap))
	}
	if c.WALBudget < 0 {
		errs = append(errs, fmt.Errorf("--wal-budget %d is negative: use 0 for max_slot_wal_keep_size", c.WALBudget))
	}
	errs = append(errs, c.Pacing.validate())
	if c.TombstoneRetention < 0 {
		errs = append(errs, fmt.Errorf("--tombstone-retention %s is negative: use 0 to keep tombstones forever", c.TombstoneRetention))
	}
	return errors.Join(errs...)
}

// monitor returns the Monitor to report to: c.Monitor, or one that counts nothing.
func (c *Config) monitor() Monitor {
	if c.Monitor == nil {
		return NopMonitor{}
	}
	return c.Monitor
}
