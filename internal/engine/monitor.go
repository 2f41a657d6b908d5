package engine

import (
	"time"

	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
)

// Monitor receives what the engine counts, for metrics; the CLI implements it with a Prometheus
// registry. Methods are called from several goroutines and must not block. Table names are as
// changebatch.TableName.String prints them.
type Monitor interface {
	// FollowStream is called with the counters of a session's streamer when it starts streaming,
	// and with nil when it stops: between streams there is no lag or watermark to report.
	FollowStream(stats func() StreamStats)
	// StreamApplied counts one committed stream apply that took d, with rows per table.
	StreamApplied(rows map[string]RowCounts, d time.Duration)
	// BackfillChunk counts one committed backfill chunk of table: rows read, and what was written.
	BackfillChunk(table string, read int64, rows RowCounts)
	// BackfillConflict counts one backfill transaction of table that lost a deadlock or a
	// serialization conflict and is retried.
	BackfillConflict(table string)
	// SlotHealth reports the stream's slot as the source describes it (every 5 s while streaming).
	SlotHealth(h SlotHealth)
	// CoverageGap reports the bytes of WAL in table's coverage gaps, 0 when covered.
	CoverageGap(table string, bytes uint64)
	// SessionRetried counts a session that failed and is started again, by reason (see reason in
	// retry.go: "constraint", "lock", "connection", "restart", ...); with "overlap" also a
	// session that waits for a table a daemon of another slot follows, at once and then once a
	// minute (settleOverlap, watchWaiting).
	SessionRetried(reason string)
	// BackfillProgress returns the Progress a backfill run of trigger ("initial", "gap",
	// "schedule") reports to: p, which it may wrap to follow the run too.
	BackfillProgress(trigger string, p Progress) Progress
	// DiscrepanciesFound counts n discrepancies of kind ("missing", "extra", "different") a
	// verify run found in table; DiscrepanciesRepaired n it repaired; DiscrepanciesSuppressed n
	// it found again under a known id (a replayed or repeated run), which recorded nothing new.
	DiscrepanciesFound(table, kind string, n int64)
	DiscrepanciesRepaired(table string, n int64)
	DiscrepanciesSuppressed(table string, n int64)
	// Leading reports whether this daemon leads slot (streams and writes) or waits as a standby
	// for the daemon that does (apply.LockLeader).
	Leading(slot string, leading bool)
}

// StreamStats are a streamer's counters (cdc.Stats): Flushed is the watermark, the LSN up to which
// the target holds every change; LagBytes the WAL between the source's latest known position and
// it; Transactions and Changes count what was received since the stream started.
type StreamStats struct {
	Flushed                         uint64
	LagBytes, Transactions, Changes int64
}

// RowCounts are the rows an apply wrote (inserted, updated or made tombstones) and the changes the
// version rule turned into no-ops because the target held the same or a newer version.
type RowCounts struct{ Applied, Suppressed int64 }

// SlotHealth is what the source says of a replication slot's hold on WAL (coverage.SlotHealth).
type SlotHealth = coverage.SlotHealth

func rowCounts(r apply.Result) RowCounts {
	return RowCounts{Applied: r.Applied, Suppressed: r.Suppressed}
}

func streamStats(st cdc.Stats) StreamStats {
	return StreamStats{Flushed: uint64(st.Flushed), LagBytes: st.Lag(), Transactions: st.Transactions, Changes: st.Changes}
}

// nopMonitor counts nothing: the Monitor of a Config without one.
type nopMonitor struct{}

func (nopMonitor) FollowStream(func() StreamStats)                   {}
func (nopMonitor) StreamApplied(map[string]RowCounts, time.Duration) {}
func (nopMonitor) BackfillChunk(string, int64, RowCounts)            {}
func (nopMonitor) BackfillConflict(string)                           {}
func (nopMonitor) SlotHealth(SlotHealth)                             {}
func (nopMonitor) CoverageGap(string, uint64)                        {}
func (nopMonitor) SessionRetried(string)                             {}
func (nopMonitor) Leading(string, bool)                              {}
func (nopMonitor) BackfillProgress(_ string, p Progress) Progress    { return p }
func (nopMonitor) DiscrepanciesFound(string, string, int64)          {}
func (nopMonitor) DiscrepanciesRepaired(string, int64)               {}
func (nopMonitor) DiscrepanciesSuppressed(string, int64)             {}
