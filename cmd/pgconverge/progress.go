package main

import (
	"io"
	"log/slog"
	"time"

	"github.com/pgconverge/pgconverge/internal/backfillrun"
	"github.com/schollz/progressbar/v3"
)

// newProgress returns a progress bar with rows, rows/s and ETA on w when w is a terminal, else
// periodic log lines (every interval) on log (backfillrun.NewLogProgress).
func newProgress(w io.Writer, terminal bool, what string, log *slog.Logger, interval time.Duration) backfillrun.Progress {
	if terminal {
		return &barProgress{w: w, what: what}
	}
	return backfillrun.NewLogProgress(log, what, interval)
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
