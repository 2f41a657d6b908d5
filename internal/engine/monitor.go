package engine

import (
	"time"

	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/backfillrun"
	"github.com/pgconverge/pgconverge/internal/pacing"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/internal/verify"
)

// Monitor receives what the engine counts, for metrics; the CLI implements it with a Prometheus
// registry. Methods are called from several goroutines and must not block. Table names are as
// changebatch.TableName.String prints them.
type Monitor interface {
	// backfillrun.Monitor counts the backfill runs' chunks and conflicts; verify.Monitor the
	// discrepancies of scheduled verify runs.
	backfillrun.Monitor
	verify.Monitor
	// FollowStream is called with the counters of a session's streamer when it starts streaming,
	// and with nil when it stops: between streams there is no lag or watermark to report.
	FollowStream(stats func() StreamStats)
	// StreamApplied counts one committed stream apply that took d, with rows per table.
	StreamApplied(rows map[string]apply.RowCounts, d time.Duration)
	// SlotHealth reports the stream's slot as the source describes it (every 5 s while streaming).
	SlotHealth(h SlotHealth)
	// GapRepaired counts a completed gap repair of table (--on-gap=repair): the source rows it
	// compared at its snapshot and the target rows it wrote, tombstones included.
	GapRepaired(table string, compared, written int64)
	// SlotCreationWait reports a creation of slot that waits for transactions open on the source
	// (pgsession.WatchSlotCreation), every few seconds while it waits, and a zero SlotWait once
	// it is done.
	SlotCreationWait(slot string, w pgsession.SlotWait)
	// TargetIndex counts what the index follower did to a source index on table's target table
	// (Config.CopyIndexes): result "built", "failed" or "dropped".
	TargetIndex(table, result string)
	// CoverageGap reports the bytes of WAL in table's coverage gaps, 0 when covered.
	CoverageGap(table string, bytes uint64)
	// SessionRetried counts a session that failed and is started again, by reason (see reason in
	// retry.go: "constraint", "lock", "connection", "restart", ...); with "overlap" also a
	// session that waits for a table a daemon of another slot follows, at once and then once a
	// minute (overlap.Settle, overlap.Watch).
	SessionRetried(reason string)
	// BackfillProgress returns the Progress a backfill run of trigger ("initial", "gap",
	// "schedule") reports to: p, which it may wrap to follow the run too.
	BackfillProgress(trigger string, p backfillrun.Progress) backfillrun.Progress
	// PacingWaited counts a wait of d of the daemon's reads of path ("load", "backfill",
	// "verify") by cause (pacing.CausePaused, CauseWALBudget, CauseLoad, CauseRate).
	PacingWaited(path, cause string, d time.Duration)
	// PacingHeld reports whether cause (pacing.CauseWALBudget, CauseLoad) holds the reads of path.
	PacingHeld(path, cause string, held bool)
	// Paused reports whether the operator paused part (control.Stream, Backfill, Verify).
	Paused(part string, paused bool)
	// RateLimits reports the rate limits in force (0: none).
	RateLimits(l pacing.Limits)
	// Leading reports whether this daemon leads slot (streams and writes) or waits as a standby
	// for the daemon that does (apply.LockLeader).
	Leading(slot string, leading bool)
}

// StreamStats are a streamer's counters (cdc.Stats): Flushed is the watermark, the LSN up to which
// the target holds every change; LagBytes the WAL between the source's latest known position and
// it; Transactions and Changes count what was received since the stream started; StreamedOpen,
// StagedBytes and StreamedCommitted are cdc.Stats' (transactions streamed before their commit).
type StreamStats struct {
	Flushed                                      uint64
	LagBytes, Transactions, Changes              int64
	StreamedOpen, StagedBytes, StreamedCommitted int64
}

// SlotHealth is what the source says of a replication slot's hold on WAL (coverage.SlotHealth).
type SlotHealth = coverage.SlotHealth

func streamStats(st cdc.Stats) StreamStats {
	return StreamStats{Flushed: uint64(st.Flushed), LagBytes: st.Lag(), Transactions: st.Transactions, Changes: st.Changes,
		StreamedOpen: st.StreamedOpen, StagedBytes: st.StagedBytes, StreamedCommitted: st.StreamedCommitted}
}

// NopMonitor counts nothing: the Monitor of a Config without one; embed it in a Monitor that
// counts only some things.
type NopMonitor struct{}

func (NopMonitor) FollowStream(func() StreamStats)                                        {}
func (NopMonitor) StreamApplied(map[string]apply.RowCounts, time.Duration)                {}
func (NopMonitor) BackfillChunk(string, int64, apply.RowCounts)                           {}
func (NopMonitor) BackfillConflict(string)                                                {}
func (NopMonitor) BackfillReadSplit(string)                                               {}
func (NopMonitor) SlotHealth(SlotHealth)                                                  {}
func (NopMonitor) CoverageGap(string, uint64)                                             {}
func (NopMonitor) GapRepaired(string, int64, int64)                                       {}
func (NopMonitor) SessionRetried(string)                                                  {}
func (NopMonitor) TargetIndex(string, string)                                             {}
func (NopMonitor) SlotCreationWait(string, pgsession.SlotWait)                            {}
func (NopMonitor) Leading(string, bool)                                                   {}
func (NopMonitor) PacingWaited(string, string, time.Duration)                             {}
func (NopMonitor) PacingHeld(string, string, bool)                                        {}
func (NopMonitor) Paused(string, bool)                                                    {}
func (NopMonitor) RateLimits(pacing.Limits)                                               {}
func (NopMonitor) BackfillProgress(_ string, p backfillrun.Progress) backfillrun.Progress { return p }
func (NopMonitor) DiscrepanciesFound(string, string, int64)                               {}
func (NopMonitor) DiscrepanciesRepaired(string, int64)                                    {}
func (NopMonitor) DiscrepanciesSuppressed(string, int64)                                  {}
