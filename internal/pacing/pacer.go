// Package pacing decides how fast a backfill or a verify reads the source: rate limits in rows
// and bytes per second (token buckets, golang.org/x/time/rate), and holds during which it reads
// nothing at all (an operator's pause, the WAL budget, the source's load). A Pacer is shared by
// every worker of the reads it paces; the zero of each limit is no limit, and a nil *Pacer paces
// nothing.
package pacing

import (
	"context"
	"io"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limits cap what the reads a Pacer paces take from the source: rows and bytes per second, 0 for
// no limit. A backfill counts the rows and bytes it reads; a verify the rows its checksum queries
// scan on the source and the bytes they return.
type Limits struct {
	RowsPerSecond  float64 `json:"max_rows_per_second"`
	BytesPerSecond float64 `json:"max_bytes_per_second"`
}

// Causes of a hold (Pacer.Hold), also the cause of a wait other than a rate limit's.
const (
	// CausePaused is an operator's pause (`pgconverge pause`).
	CausePaused = "paused"
	// CauseWALBudget is the slot holding more WAL than the budget lets backfills and verify run.
	CauseWALBudget = "wal-budget"
	// CauseLoad is the source's load past a pacing limit (standby lag, stream lag, active
	// sessions).
	CauseLoad = "load"
	// CauseRate is a wait for a rate limit's tokens (Limits).
	CauseRate = "rate"
)

// Pacer paces the reads of one kind (a daemon's backfills, its verifies, a backfill process).
// Its methods are safe for concurrent use; a nil *Pacer never waits.
type Pacer struct {
	rows, bytes *rate.Limiter
	// waited, when set, is told of each wait: its cause and how long it lasted.
	waited func(cause string, d time.Duration)

	mu     sync.Mutex
	limits Limits
	holds  map[string]string // cause -> why
	// changed is closed and replaced whenever the holds change.
	changed chan struct{}
}

// New returns a Pacer with limits l and no hold; waited, when not nil, is told of every wait
// (cause: one of the Cause constants; d > 0).
func New(l Limits, waited func(cause string, d time.Duration)) *Pacer {
	p := &Pacer{rows: rate.NewLimiter(rate.Inf, 1), bytes: rate.NewLimiter(rate.Inf, 1), waited: waited,
		holds: map[string]string{}, changed: make(chan struct{})}
	p.SetLimits(l)
	return p
}

// SetLimits replaces the limits (a wait under way finishes at the rate it began with, at most a
// tenth of a second's worth).
func (p *Pacer) SetLimits(l Limits) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.limits = l
	setLimit(p.rows, l.RowsPerSecond)
	setLimit(p.bytes, l.BytesPerSecond)
}

// burstShare is the share of a second's worth of tokens a limiter may hand out at once: reads
// come at most a tenth of a second's rows or bytes together, so the source sees a steady load.
const burstShare = 0.1

// setLimit sets lim to perSecond tokens a second with a burst of a tenth of a second's worth (at
// least 1), or to no limit when perSecond is 0 or less.
func setLimit(lim *rate.Limiter, perSecond float64) {
	if perSecond <= 0 {
		lim.SetLimit(rate.Inf)
		return
	}
	lim.SetLimit(rate.Limit(perSecond))
	lim.SetBurst(int(min(max(math.Ceil(perSecond*burstShare), 1), math.MaxInt32)))
}

// Limits returns the limits in force.
func (p *Pacer) Limits() Limits {
	if p == nil {
		return Limits{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.limits
}

// Hold stops the reads at their next Take or Wait until Release(cause); why says what to the
// logs and status. It reports whether cause was not held before (a new why replaces the old).
func (p *Pacer) Hold(cause, why string) bool {
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	_, held := p.holds[cause]
	p.holds[cause] = why
	if !held {
		close(p.changed)
		p.changed = make(chan struct{})
	}
	return !held
}

// Release ends the hold of cause; it reports whether cause was held.
func (p *Pacer) Release(cause string) bool {
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, held := p.holds[cause]; !held {
		return false
	}
	delete(p.holds, cause)
	close(p.changed)
	p.changed = make(chan struct{})
	return true
}

// Holds returns the causes held now, sorted, each with its why.
func (p *Pacer) Holds() map[string]string {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]string, len(p.holds))
	for c, why := range p.holds {
		out[c] = why
	}
	return out
}

// Wait returns once nothing holds the reads, or with ctx's error when ctx ends first. The time it
// waited is told to waited under the first cause held when it began (sorted).
func (p *Pacer) Wait(ctx context.Context) error {
	if p == nil {
		return nil
	}
	began := time.Now()
	cause := ""
	for {
		p.mu.Lock()
		if len(p.holds) == 0 {
			p.mu.Unlock()
			break
		}
		if cause == "" {
			cause = slices.Sorted(maps.Keys(p.holds))[0]
		}
		changed := p.changed
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			p.tell(cause, time.Since(began))
			return ctx.Err()
		case <-changed:
		}
	}
	p.tell(cause, time.Since(began))
	return nil
}

// Take waits while the reads are held (Wait), then for the rate limits (TakeRate). It returns
// ctx's error when ctx ends first.
func (p *Pacer) Take(ctx context.Context, rows, bytes int64) error {
	if p == nil {
		return nil
	}
	if err := p.Wait(ctx); err != nil {
		return err
	}
	return p.TakeRate(ctx, rows, bytes)
}

// TakeRate waits for the rate limits to allow rows rows and bytes bytes more, taken a burst (a
// tenth of a second's worth) at a time, whatever holds the reads: for a read that cannot stop
// where it is (one inside a target transaction, which must not wait for a hold that only the
// stream's progress ends). It returns ctx's error when ctx ends first.
func (p *Pacer) TakeRate(ctx context.Context, rows, bytes int64) error {
	if p == nil {
		return nil
	}
	began := time.Now()
	defer func() { p.tell(CauseRate, time.Since(began)) }()
	if err := take(ctx, p.rows, rows); err != nil {
		return err
	}
	return take(ctx, p.bytes, bytes)
}

// take waits for n tokens of lim, at most its burst at a time. A step refused because SetLimits
// lowered the burst meanwhile is taken again at the new burst.
func take(ctx context.Context, lim *rate.Limiter, n int64) error {
	for n > 0 {
		if lim.Limit() == rate.Inf {
			return nil
		}
		step := min(n, int64(max(lim.Burst(), 1)))
		if err := lim.WaitN(ctx, int(step)); err != nil {
			if ctx.Err() == nil && step > int64(lim.Burst()) {
				continue
			}
			return err
		}
		n -= step
	}
	return nil
}

// tell reports a wait of d under cause to waited, when it lasted at all.
func (p *Pacer) tell(cause string, d time.Duration) {
	if p.waited != nil && cause != "" && d >= time.Millisecond {
		p.waited(cause, d)
	}
}

// takeEvery is how many bytes or messages a Writer passes before it takes them from the pacer.
const (
	takeEveryBytes = 64 << 10
	takeEveryRows  = 256
)

// Writer returns w paced by p's rate limits (TakeRate, not the holds: the caller waits for those
// before it starts, and a COPY is written inside a target transaction): each Write is counted as
// one row and its bytes, which fits the source's COPY output, one CopyData message per row
// (PostgreSQL docs, "COPY Operations" in the frontend/backend protocol), taken every 64 KiB or
// 256 rows, and the rest by Flush. A Write that waits returns ctx's error when ctx ends first. A
// nil p paces nothing.
func (p *Pacer) Writer(ctx context.Context, w io.Writer) *Writer {
	return &Writer{ctx: ctx, w: w, p: p}
}

// Writer is a writer paced by a Pacer (Pacer.Writer).
type Writer struct {
	ctx         context.Context
	w           io.Writer
	p           *Pacer
	rows, bytes int64
	waited      time.Duration
}

// Write takes what was written since the last take when it reaches a step, then writes b.
func (pw *Writer) Write(b []byte) (int, error) {
	pw.rows++
	pw.bytes += int64(len(b))
	if pw.rows >= takeEveryRows || pw.bytes >= takeEveryBytes {
		if err := pw.Flush(); err != nil {
			return 0, err
		}
	}
	return pw.w.Write(b)
}

// Flush takes what was written since the last take.
func (pw *Writer) Flush() error {
	if pw.p == nil || pw.rows == 0 && pw.bytes == 0 {
		return nil
	}
	began := time.Now()
	err := pw.p.TakeRate(pw.ctx, pw.rows, pw.bytes)
	pw.waited += time.Since(began)
	pw.rows, pw.bytes = 0, 0
	return err
}

// Waited returns how long its writes waited for the rate limits (0 for a nil Writer).
func (pw *Writer) Waited() time.Duration {
	if pw == nil {
		return 0
	}
	return pw.waited
}
