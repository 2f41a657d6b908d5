package backfillrun

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/pgconverge/pgconverge/internal/lease"
)

// Progress follows a long job in rows: Start with the estimated total (0 when unknown) and the
// rows already done, Add as rows complete, Finish at the end. Add may be called from several
// goroutines.
type Progress interface {
	Start(total, done int64)
	Add(rows int64)
	Finish()
}

// NewLogProgress returns a Progress that logs what with rows, rows/s and the estimated time left
// on log every interval.
func NewLogProgress(log *slog.Logger, what string, interval time.Duration) Progress {
	return &logProgress{log: log, what: what, interval: interval}
}

// logProgress logs rows, rows/s and the estimated time left every interval.
type logProgress struct {
	log      *slog.Logger
	what     string
	interval time.Duration
	mu       sync.Mutex
	total    int64
	done     int64
	began    time.Time
	start    int64
	stop     func()
}

func (p *logProgress) Start(total, done int64) {
	p.total, p.done, p.start, p.began = total, done, done, time.Now()
	p.stop = lease.Every(context.Background(), p.interval, func(context.Context) { p.report() })
}

func (p *logProgress) report() {
	p.mu.Lock()
	done, total, start := p.done, p.total, p.start
	p.mu.Unlock()
	rate := float64(done-start) / max(time.Since(p.began).Seconds(), 0.001)
	attrs := []any{"rows", done, "rows_per_s", int64(rate)}
	if total > done && rate > 0 {
		attrs = append(attrs, "estimated_rows", total, "eta", (time.Duration(float64(total-done)/rate) * time.Second).Round(time.Second).String())
	}
	p.log.Info(p.what, attrs...)
}

func (p *logProgress) Add(rows int64) {
	p.mu.Lock()
	p.done += rows
	p.mu.Unlock()
}

func (p *logProgress) Finish() {
	if p.stop != nil {
		p.stop()
	}
}

// NopProgress reports nothing: the Progress of a run without one.
type NopProgress struct{}

func (NopProgress) Start(total, done int64) {}
func (NopProgress) Add(rows int64)          {}
func (NopProgress) Finish()                 {}
