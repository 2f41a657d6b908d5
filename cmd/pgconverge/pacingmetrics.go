package main

import (
	"time"

	"github.com/pgconverge/pgconverge/internal/control"
	"github.com/pgconverge/pgconverge/internal/pacing"
	"github.com/prometheus/client_golang/prometheus"
)

// pacingMetrics are the metrics of the daemon's pacing of its reads of the source: pauses, rate
// limits, the WAL budget's and the load's holds (engine.Monitor's PacingWaited, PacingHeld, Paused,
// RateLimits).
type pacingMetrics struct {
	waited       *prometheus.CounterVec
	held, paused *prometheus.GaugeVec
	limits       *prometheus.GaugeVec
	splits       *prometheus.CounterVec
}

// newPacingMetrics makes the pacing metrics and registers them with register.
func newPacingMetrics(register func(prometheus.Collector)) *pacingMetrics {
	p := &pacingMetrics{
		waited: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgconverge_pacing_wait_seconds_total",
			Help: "Seconds the daemon's reads of the source waited, by path (load: initial and gap loads; backfill: backfills while streaming; verify) and cause (paused, wal-budget, load, rate)."}, []string{"path", "cause"}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pgconverge_pacing_held",
			Help: "1 while a cause (wal-budget, load) holds a path's reads of the source (load, backfill, verify), else 0."}, []string{"path", "cause"}),
		paused: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pgconverge_paused",
			Help: "1 while the operator has paused a part of the daemon (stream, backfill, verify: pgconverge pause), else 0."}, []string{"what"}),
		limits: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pgconverge_rate_limit",
			Help: "The rate limit in force for each of the daemon's backfills and verifies, by unit (rows_per_second, bytes_per_second); 0 for no limit."}, []string{"unit"}),
		splits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgconverge_backfill_reads_split_total",
			Help: "Times a backfill read of a table took longer than --chunk-time-cap and the table's further reads were split into half as many rows, by table."}, []string{"table"}),
	}
	for _, c := range []prometheus.Collector{p.waited, p.held, p.paused, p.limits, p.splits} {
		register(c)
	}
	for _, part := range control.Parts {
		p.paused.WithLabelValues(part)
	}
	return p
}

// PacingWaited counts a wait of the daemon's reads of path.
func (m *metrics) PacingWaited(path, cause string, d time.Duration) {
	m.pacing.waited.WithLabelValues(path, cause).Add(d.Seconds())
}

// PacingHeld sets whether cause holds path's reads.
func (m *metrics) PacingHeld(path, cause string, held bool) {
	m.pacing.held.WithLabelValues(path, cause).Set(boolGauge(held))
}

// Paused sets whether the operator paused part.
func (m *metrics) Paused(part string, paused bool) {
	m.pacing.paused.WithLabelValues(part).Set(boolGauge(paused))
}

// RateLimits sets the rate limits in force.
func (m *metrics) RateLimits(l pacing.Limits) {
	m.pacing.limits.WithLabelValues("rows_per_second").Set(l.RowsPerSecond)
	m.pacing.limits.WithLabelValues("bytes_per_second").Set(l.BytesPerSecond)
}

// BackfillReadSplit counts a split of table's backfill reads.
func (m *metrics) BackfillReadSplit(table string) { m.pacing.splits.WithLabelValues(table).Inc() }

// boolGauge is 1 for true, 0 for false.
func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
