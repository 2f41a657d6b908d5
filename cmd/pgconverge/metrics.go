package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"sync"
	"time"

	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/backfillrun"
	"github.com/pgconverge/pgconverge/internal/engine"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the daemon's Prometheus metrics (github.com/prometheus/client_golang), in their own
// registry, and its readiness (/readyz): the engine.Monitor of `run --metrics-addr`.
type metrics struct {
	reg          *prometheus.Registry
	ready        *readiness
	applied      *prometheus.CounterVec
	suppressed   *prometheus.CounterVec
	transactions prometheus.Counter
	applySeconds prometheus.Histogram
	gapBytes     *prometheus.GaugeVec
	backfillRows *prometheus.CounterVec
	gapCompared  *prometheus.CounterVec
	indexes      *prometheus.CounterVec
	slotWait     *prometheus.GaugeVec
	slotBlockers *prometheus.GaugeVec
	backfillDone *prometheus.GaugeVec
	conflicts    *prometheus.CounterVec
	retries      *prometheus.CounterVec
	leader       *prometheus.GaugeVec

	discFound      *prometheus.CounterVec
	discRepaired   *prometheus.CounterVec
	discSuppressed *prometheus.CounterVec

	changes    prometheus.Counter
	slotSafe   *prometheus.GaugeVec
	slotHeld   *prometheus.GaugeVec
	slotStatus *prometheus.GaugeVec

	mu          sync.Mutex
	stream      func() engine.StreamStats // the current session's streamer, nil between sessions
	txSeen      int64                     // transactions of the current streamer already counted
	changesSeen int64                     // changes of the current streamer already counted
	// pacing are the pacing metrics (pacingmetrics.go).
	pacing *pacingMetrics
}

// Descriptions of the metrics streamCollector reports while a stream runs.
var (
	lagDesc = prometheus.NewDesc("pgconverge_replication_lag_bytes",
		"Bytes of WAL between the latest known source position and the position the target committed; absent while not streaming.", nil, nil)
	watermarkDesc = prometheus.NewDesc("pgconverge_watermark_lsn",
		"The stream's watermark, the LSN up to which the target holds every change, as a number; absent while not streaming.", nil, nil)
	streamedOpenDesc = prometheus.NewDesc("pgconverge_streamed_transactions_open",
		"Transactions the source streams before their commit (--stream-in-progress) that have not committed or aborted yet; absent while not streaming.", nil, nil)
	stagedBytesDesc = prometheus.NewDesc("pgconverge_streamed_staged_bytes",
		"Bytes of pgoutput messages those open transactions staged on the target (pgconverge.stream_staging); absent while not streaming.", nil, nil)
	streamedCommittedDesc = prometheus.NewDesc("pgconverge_streamed_transactions_committed",
		"Streamed transactions committed and applied at their commit during the current stream; absent while not streaming.", nil, nil)
)

// streamCollector reports the current stream's lag and watermark, and nothing between streams
// (during loads and reconnects), so that a dashboard never reads a made-up 0.
type streamCollector struct{ m *metrics }

func (c streamCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{lagDesc, watermarkDesc, streamedOpenDesc, stagedBytesDesc, streamedCommittedDesc} {
		ch <- d
	}
}

func (c streamCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	stream := c.m.stream
	c.m.mu.Unlock()
	if stream == nil {
		return
	}
	st := stream()
	ch <- prometheus.MustNewConstMetric(lagDesc, prometheus.GaugeValue, float64(st.LagBytes))
	ch <- prometheus.MustNewConstMetric(watermarkDesc, prometheus.GaugeValue, float64(st.Flushed))
	ch <- prometheus.MustNewConstMetric(streamedOpenDesc, prometheus.GaugeValue, float64(st.StreamedOpen))
	ch <- prometheus.MustNewConstMetric(stagedBytesDesc, prometheus.GaugeValue, float64(st.StagedBytes))
	ch <- prometheus.MustNewConstMetric(streamedCommittedDesc, prometheus.GaugeValue, float64(st.StreamedCommitted))
}

// newMetrics registers every metric in a new registry.
func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry(), ready: newReadiness()}
	f := func(c prometheus.Collector) { m.reg.MustRegister(c) }
	m.applied = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgconverge_rows_applied_total",
		Help: "Target rows written (inserted, updated or made tombstones), by table and path (stream, backfill or gap-repair)."}, []string{"table", "path"})
	m.suppressed = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgconverge_duplicates_suppressed_total",
		Help: "Changes the version rule turned into no-ops because the target held the same or a newer version (replays, retries, the losing side of a stream/backfill race), by table and path."}, []string{"table", "path"})
	m.transactions = prometheus.NewCounter(prometheus.CounterOpts{Name: "pgconverge_transactions_applied_total",
		Help: "Source transactions applied by the stream."})
	m.applySeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "pgconverge_apply_batch_seconds",
		Help:    "Duration of one stream apply: a target transaction with a group of source transactions and the progress LSN.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 15)})
	m.gapBytes = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pgconverge_coverage_gap_bytes",
		Help: "Bytes of WAL in the table's coverage gaps (ranges no backfill and no stream delivered); 0 when covered."}, []string{"table"})
	m.backfillRows = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgconverge_backfill_rows_total",
		Help: "Rows read from source snapshots by backfills, by table (of which rows_applied_total{path=\"backfill\"} were written)."}, []string{"table"})
	m.gapCompared = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgconverge_gap_repair_rows_compared_total",
		Help: "Source rows gap repairs (run --on-gap=repair) compared with the target at their snapshot, by table (of which rows_applied_total{path=\"gap-repair\"} were written)."}, []string{"table"})
	m.indexes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgconverge_target_indexes_total",
		Help: "Source indexes the daemon built on (result built), failed to build on (failed, tried again each minute), or dropped from (dropped) the target tables (run --copy-indexes), by table."}, []string{"table", "result"})
	m.slotWait = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pgconverge_slot_creation_wait_seconds",
		Help: "How long the creation of the daemon's slot has waited for transactions open on the source (reported after 5 s, every 5 s); 0 when it is not waiting."}, []string{"slot"})
	m.slotBlockers = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pgconverge_slot_creation_blockers",
		Help: "Source backends the creation of the daemon's slot waits for (pg_blocking_pids of its walsender); 0 when it is not waiting."}, []string{"slot"})
	m.backfillDone = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pgconverge_backfill_progress_ratio",
		Help: "Rows done over rows estimated of the running backfill run, by trigger (initial, gap, schedule); 1 when it finished."}, []string{"trigger"})
	m.conflicts = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgconverge_backfill_conflicts_total",
		Help: "Backfill transactions that lost a deadlock or a serialization conflict with a concurrent writer (the stream, or another session on the target) and were retried, by table."}, []string{"table"})
	m.retries = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgconverge_session_retries_total",
		Help: "Daemon sessions that failed and were started again, by reason (constraint, lock, conflict, resources, connection, timeout, slot-busy, schema, watch, restart, leadership, overlap, other); the log line at ERROR or WARN names the cause and the fix."}, []string{"reason"})
	m.leader = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pgconverge_leader",
		Help: "1 while this daemon leads the slot (streams and writes), 0 while it waits as a standby for the daemon that does; absent before it first tried."}, []string{"slot"})
	for _, c := range []prometheus.Collector{m.applied, m.suppressed, m.transactions, m.applySeconds, m.gapBytes, m.backfillRows, m.gapCompared, m.indexes, m.slotWait, m.slotBlockers, m.backfillDone, m.conflicts, m.retries, m.leader} {
		f(c)
	}
	// Every reason's series exists from the start, so the first retry of a kind is an increase
	// that rate() and increase() see.
	for _, r := range engine.RetryReasons() {
		m.retries.WithLabelValues(r)
	}
	m.changes = prometheus.NewCounter(prometheus.CounterOpts{Name: "pgconverge_changes_received_total",
		Help: "Row changes received from the stream (before changes of one key in one apply are collapsed into the newest)."})
	m.slotSafe = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pgconverge_slot_safe_wal_size_bytes",
		Help: "Bytes of WAL the source may still write before it invalidates the slot (pg_replication_slots.safe_wal_size; absent when unlimited)."}, []string{"slot"})
	m.slotHeld = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pgconverge_slot_restart_lag_bytes",
		Help: "Bytes of WAL the slot holds back on the source: current position minus restart_lsn."}, []string{"slot"})
	m.slotStatus = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pgconverge_slot_wal_status",
		Help: "1 for the slot's current wal_status (reserved, extended, unreserved, lost), 0 for the others."}, []string{"slot", "wal_status"})
	m.discFound = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgconverge_discrepancies_found_total",
		Help: "Discrepancies verify found (keys whose target row disagreed with the source at the verified snapshot), by table and kind (missing, extra, different)."}, []string{"table", "kind"})
	m.discRepaired = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgconverge_discrepancies_repaired_total",
		Help: "Discrepancies verify --repair rewrote from the source and closed, by table."}, []string{"table"})
	m.discSuppressed = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgconverge_discrepancies_suppressed_total",
		Help: "Discrepancies verify found again under an id already recorded (a repeated or replayed run over the same drift), which recorded nothing new, by table."}, []string{"table"})
	for _, c := range []prometheus.Collector{m.discFound, m.discRepaired, m.discSuppressed, m.changes, m.slotSafe, m.slotHeld, m.slotStatus, streamCollector{m}} {
		f(c)
	}
	m.pacing = newPacingMetrics(f)
	f(collectors.NewGoCollector())
	f(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// metricsListenAddr returns addr with the loopback address 127.0.0.1 as its host when it names a
// port only (":9187" or "9187"): the endpoint is reachable from other hosts only when the
// operator names an address (0.0.0.0:9187, a host's own). Other forms are returned as given.
func metricsListenAddr(addr string) string {
	if !strings.Contains(addr, ":") {
		return net.JoinHostPort("127.0.0.1", addr)
	}
	if host, port, err := net.SplitHostPort(addr); err == nil && host == "" {
		return net.JoinHostPort("127.0.0.1", port)
	}
	return addr
}

// serve serves /metrics, /healthz and /readyz (health.go) on addr (metricsListenAddr) until ctx
// ends; it returns once the listener is up.
func (m *metrics) serve(ctx context.Context, addr string, withProfiles bool, log *slog.Logger) error {
	addr = metricsListenAddr(addr)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen for metrics on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", healthz)
	mux.HandleFunc("/readyz", m.ready.readyz)
	if withProfiles {
		// Go's runtime profiles (net/http/pprof): go tool pprof http://ADDR/debug/pprof/profile.
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "err", err)
		}
	}()
	context.AfterFunc(ctx, func() { srv.Close() })
	log.Info("serving metrics", "addr", ln.Addr().String(), "path", "/metrics", "health", "/healthz", "readiness", "/readyz", "profiles", withProfiles)
	return nil
}

// FollowStream makes the lag and watermark gauges read stats (a session's streamer), and /readyz
// answer ready; nil stops both.
func (m *metrics) FollowStream(stats func() engine.StreamStats) {
	m.ready.following(stats != nil)
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stream, m.txSeen, m.changesSeen = stats, 0, 0
}

// StreamApplied counts one committed stream apply of rows per table that took d.
func (m *metrics) StreamApplied(rows map[string]apply.RowCounts, d time.Duration) {
	m.applySeconds.Observe(d.Seconds())
	for table, r := range rows {
		m.applied.WithLabelValues(table, "stream").Add(float64(r.Applied))
		m.suppressed.WithLabelValues(table, "stream").Add(float64(r.Suppressed))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stream != nil {
		// Every whole transaction received so far was in this apply or an earlier one.
		st := m.stream()
		m.transactions.Add(float64(st.Transactions - m.txSeen))
		m.changes.Add(float64(st.Changes - m.changesSeen))
		m.txSeen, m.changesSeen = st.Transactions, st.Changes
	}
}

// BackfillChunk counts the rows of one applied backfill chunk of table.
func (m *metrics) BackfillChunk(table string, read int64, r apply.RowCounts) {
	m.backfillRows.WithLabelValues(table).Add(float64(read))
	m.applied.WithLabelValues(table, "backfill").Add(float64(r.Applied))
	m.suppressed.WithLabelValues(table, "backfill").Add(float64(r.Suppressed))
}

// GapRepaired counts one gap repair of table: rows compared and rows written.
func (m *metrics) GapRepaired(table string, compared, written int64) {
	m.gapCompared.WithLabelValues(table).Add(float64(compared))
	m.applied.WithLabelValues(table, "gap-repair").Add(float64(written))
}

// SlotCreationWait sets the slot creation's wait gauges (0 once it is done).
func (m *metrics) SlotCreationWait(slot string, w pgsession.SlotWait) {
	m.slotWait.WithLabelValues(slot).Set(w.Waited.Seconds())
	m.slotBlockers.WithLabelValues(slot).Set(float64(len(w.Blockers)))
}

// TargetIndex counts what the index follower did to one index of table's target table.
func (m *metrics) TargetIndex(table, result string) { m.indexes.WithLabelValues(table, result).Inc() }

// BackfillConflict counts one lost and retried backfill transaction of table.
func (m *metrics) BackfillConflict(table string) { m.conflicts.WithLabelValues(table).Inc() }

// SlotHealth sets the slot health gauges.
func (m *metrics) SlotHealth(h coverage.SlotHealth) {
	if h.SafeWALSizeBytes != nil {
		m.slotSafe.WithLabelValues(h.Name).Set(float64(*h.SafeWALSizeBytes))
	} else {
		m.slotSafe.DeleteLabelValues(h.Name)
	}
	m.slotHeld.WithLabelValues(h.Name).Set(float64(h.RestartLagBytes))
	for _, s := range []string{"reserved", "extended", "unreserved", "lost"} {
		v := 0.0
		if s == h.WALStatus {
			v = 1
		}
		m.slotStatus.WithLabelValues(h.Name, s).Set(v)
	}
}

// CoverageGap sets table's coverage gap gauge.
func (m *metrics) CoverageGap(table string, bytes uint64) {
	m.gapBytes.WithLabelValues(table).Set(float64(bytes))
}

// DiscrepanciesFound counts discrepancies a verify run found.
func (m *metrics) DiscrepanciesFound(table, kind string, n int64) {
	m.discFound.WithLabelValues(table, kind).Add(float64(n))
}

// DiscrepanciesRepaired counts discrepancies a verify run repaired.
func (m *metrics) DiscrepanciesRepaired(table string, n int64) {
	m.discRepaired.WithLabelValues(table).Add(float64(n))
}

// DiscrepanciesSuppressed counts discrepancies found again under a known id.
func (m *metrics) DiscrepanciesSuppressed(table string, n int64) {
	m.discSuppressed.WithLabelValues(table).Add(float64(n))
}

// Leading sets the leader gauge of slot; /readyz says a standby waits.
func (m *metrics) Leading(slot string, leading bool) {
	v := 0.0
	if leading {
		v = 1
	} else {
		m.ready.set(false, fmt.Sprintf("standby: another daemon leads slot %s; this one takes over when that one stops or loses its connection to the target", slot))
	}
	m.leader.WithLabelValues(slot).Set(v)
}

// SessionRetried counts a session started again after a failure; /readyz says it reconnects.
func (m *metrics) SessionRetried(reason string) {
	m.ready.retrying(reason)
	m.retries.WithLabelValues(reason).Inc()
}

// BackfillProgress returns p, which also sets the progress gauge of trigger's runs; before
// streaming, /readyz says tables are loading.
func (m *metrics) BackfillProgress(trigger string, p backfillrun.Progress) backfillrun.Progress {
	m.ready.loading(trigger)
	return &gaugedProgress{Progress: p, g: m.backfillDone.WithLabelValues(trigger)}
}

// gaugedProgress is a progress that also sets a ratio gauge.
type gaugedProgress struct {
	backfillrun.Progress
	g           prometheus.Gauge
	mu          sync.Mutex
	total, done int64
}

func (p *gaugedProgress) Start(total, done int64) {
	p.Progress.Start(total, done)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.total, p.done = total, done
	p.set()
}

func (p *gaugedProgress) Add(rows int64) {
	p.Progress.Add(rows)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done += rows
	p.set()
}

func (p *gaugedProgress) Finish() {
	p.Progress.Finish()
	p.g.Set(1)
}

func (p *gaugedProgress) set() {
	if p.total > 0 {
		p.g.Set(min(1, float64(p.done)/float64(p.total)))
	}
}
