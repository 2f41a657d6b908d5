package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the daemon's Prometheus metrics (github.com/prometheus/client_golang), in their own
// registry. A nil *metrics records nothing, so code paths without --metrics-addr need no checks.
type metrics struct {
	reg          *prometheus.Registry
	applied      *prometheus.CounterVec
	suppressed   *prometheus.CounterVec
	transactions prometheus.Counter
	applySeconds prometheus.Histogram
	gapBytes     *prometheus.GaugeVec
	backfillRows *prometheus.CounterVec
	backfillDone *prometheus.GaugeVec

	mu     sync.Mutex
	stream func() cdc.Stats // the current session's streamer, nil between sessions
	txSeen int64            // transactions of the current streamer already counted
}

// newMetrics registers every metric in a new registry.
func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	f := func(c prometheus.Collector) { m.reg.MustRegister(c) }
	m.applied = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgconverge_rows_applied_total",
		Help: "Target rows written (inserted, updated or made tombstones), by table and path (stream or backfill)."}, []string{"table", "path"})
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
		Help: "Rows read from source snapshots and applied by backfills, by table."}, []string{"table"})
	m.backfillDone = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pgconverge_backfill_progress_ratio",
		Help: "Rows done over rows estimated of the running backfill run, by trigger (initial, gap, schedule); 1 when it finished."}, []string{"trigger"})
	for _, c := range []prometheus.Collector{m.applied, m.suppressed, m.transactions, m.applySeconds, m.gapBytes, m.backfillRows, m.backfillDone} {
		f(c)
	}
	stat := func(name, help string, v func(cdc.Stats) float64) {
		f(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 {
			m.mu.Lock()
			defer m.mu.Unlock()
			if m.stream == nil {
				return 0
			}
			return v(m.stream())
		}))
	}
	stat("pgconverge_replication_lag_bytes", "Bytes of WAL between the source's current position and the position the target committed.",
		func(s cdc.Stats) float64 { return float64(s.Lag()) })
	stat("pgconverge_watermark_lsn", "The stream's watermark: the LSN up to which the target holds every change, as a number (0 while not streaming).",
		func(s cdc.Stats) float64 { return float64(s.Flushed) })
	f(collectors.NewGoCollector())
	f(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// serve serves /metrics on addr until ctx ends; it returns once the listener is up.
func (m *metrics) serve(ctx context.Context, addr string, log *slog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listen for metrics on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics server stopped", "err", err)
		}
	}()
	context.AfterFunc(ctx, func() { srv.Close() })
	log.Info("serving metrics", "addr", ln.Addr().String(), "path", "/metrics")
	return nil
}

// follow makes the lag and watermark gauges read stats (a session's streamer); nil stops that.
func (m *metrics) follow(stats func() cdc.Stats) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stream, m.txSeen = stats, 0
}

// streamApplied counts one committed stream apply of table results that took d.
func (m *metrics) streamApplied(results map[string]apply.Result, d time.Duration) {
	if m == nil {
		return
	}
	m.applySeconds.Observe(d.Seconds())
	for table, r := range results {
		m.applied.WithLabelValues(table, "stream").Add(float64(r.Applied))
		m.suppressed.WithLabelValues(table, "stream").Add(float64(r.Suppressed))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stream != nil {
		// Every whole transaction received so far was in this apply or an earlier one.
		n := m.stream().Transactions
		m.transactions.Add(float64(n - m.txSeen))
		m.txSeen = n
	}
}

// backfillChunk counts the rows of one applied backfill chunk of table.
func (m *metrics) backfillChunk(table string, rows int64, r apply.Result) {
	if m == nil {
		return
	}
	m.backfillRows.WithLabelValues(table).Add(float64(rows))
	m.applied.WithLabelValues(table, "backfill").Add(float64(r.Applied))
	m.suppressed.WithLabelValues(table, "backfill").Add(float64(r.Suppressed))
}

// setGap sets table's coverage gap gauge.
func (m *metrics) setGap(table string, bytes uint64) {
	if m == nil {
		return
	}
	m.gapBytes.WithLabelValues(table).Set(float64(bytes))
}

// progress returns p, which also sets the progress gauge of trigger's runs.
func (m *metrics) progress(trigger string, p progress) progress {
	if m == nil {
		return p
	}
	return &gaugedProgress{progress: p, g: m.backfillDone.WithLabelValues(trigger)}
}

// gaugedProgress is a progress that also sets a ratio gauge.
type gaugedProgress struct {
	progress
	g           prometheus.Gauge
	mu          sync.Mutex
	total, done int64
}

func (p *gaugedProgress) Start(total, done int64) {
	p.progress.Start(total, done)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.total, p.done = total, done
	p.set()
}

func (p *gaugedProgress) Add(rows int64) {
	p.progress.Add(rows)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done += rows
	p.set()
}

func (p *gaugedProgress) Finish() {
	p.progress.Finish()
	p.g.Set(1)
}

func (p *gaugedProgress) set() {
	if p.total > 0 {
		p.g.Set(min(1, float64(p.done)/float64(p.total)))
	}
}
