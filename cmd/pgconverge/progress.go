package main

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress follows a long job in rows: Start with the estimated total (0 when unknown) and the
// rows already done, Add as rows complete, Finish at the end.
type progress interface {
	Start(total, done int64)
	Add(rows int64)
	Finish()
}

// newProgress returns a progress bar with rows, rows/s and ETA on w when w is a terminal, else
// periodic log lines (every interval) on log.
func newProgress(w io.Writer, terminal bool, what string, log *slog.Logger, interval time.Duration) progress {
	if terminal {
		return &barProgress{w: w, what: what}
	}
	return &logProgress{log: log, what: what, interval: interval}
}

// barProgress draws a progress bar (github.com/schollz/progressbar/v3).
type barProgress struct {
	w    io.Writer
	what string
	bar  *progressbar.ProgressBar
}

func (p *barProgress) Start(total, done int64) {
	if total < done {
		total = -1 // unknown: a spinner with the count
	}
	p.bar = progressbar.NewOptions64(total, progressbar.OptionSetWriter(p.w), progressbar.OptionSetDescription(p.what),
		progressbar.OptionShowCount(), progressbar.OptionShowIts(), progressbar.OptionSetItsString("rows"),
		progressbar.OptionSetPredictTime(true), progressbar.OptionThrottle(200*time.Millisecond),
		progressbar.OptionFullWidth(), progressbar.OptionClearOnFinish())
	p.bar.Add64(done)
}

func (p *barProgress) Add(rows int64) {
	if p.bar.GetMax64() > 0 && p.bar.State().CurrentNum+rows > p.bar.GetMax64() {
		p.bar.ChangeMax64(p.bar.State().CurrentNum + rows) // the estimate was low
	}
	p.bar.Add64(rows)
}

func (p *barProgress) Finish() { p.bar.Finish() }

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
	p.stop = every(context.Background(), p.interval, p.report)
}

// every calls fn every d in a goroutine until ctx ends or the returned function is called.
func every(ctx context.Context, d time.Duration, fn func()) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				fn()
			}
		}
	}()
	return cancel
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
