package engine

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/internal/control"
	"github.com/pgconverge/pgconverge/internal/pacing"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// controlEvery is how often the daemon reads its controls (pauses, rate limits) from the ledger.
const controlEvery = time.Second

// daemonPace paces the daemon's reads of the source for its whole life, across sessions: its
// loads (what a session loads before it streams: initial, gap, schema-change and snapshot-only
// loads; a WAL budget or a stream lag cannot hold them, since only the stream they hold up would
// lower it), its backfills while streaming (scheduled ones), its verifies, and whether its stream
// is paused. streaming is true while a session streams.
type daemonPace struct {
	load, backfill, verify  *pacing.Pacer
	streamPaused, streaming atomic.Bool
	// mu guards the last controls applied, to log what changed.
	mu   sync.Mutex
	last control.State
}

// newDaemonPace returns the daemon's pacers, at cfg's rate limits, reporting their waits to mon.
func newDaemonPace(cfg Config) *daemonPace {
	mon := cfg.monitor()
	pacer := func(path string) *pacing.Pacer {
		return pacing.New(cfg.Limits, func(cause string, d time.Duration) { mon.PacingWaited(path, cause, d) })
	}
	return &daemonPace{load: pacer("load"), backfill: pacer("backfill"), verify: pacer("verify")}
}

// loadPacer returns the pacer of the loads a session runs before it streams (nil: none).
func (p *daemonPace) loadPacer() *pacing.Pacer {
	if p == nil {
		return nil
	}
	return p.load
}

// backfillPacer returns the pacer of the backfills that run while the stream does (nil: none).
func (p *daemonPace) backfillPacer() *pacing.Pacer {
	if p == nil {
		return nil
	}
	return p.backfill
}

// verifyPacer returns the pacer of the daemon's verifies (nil: none).
func (p *daemonPace) verifyPacer() *pacing.Pacer {
	if p == nil {
		return nil
	}
	return p.verify
}

// setStreaming records whether a session streams now.
func (p *daemonPace) setStreaming(on bool) {
	if p != nil {
		p.streaming.Store(on)
	}
}

// paused reports whether the operator paused the stream.
func (p *daemonPace) paused() bool { return p != nil && p.streamPaused.Load() }

// apply brings the pacers in line with the ledger's controls st, logging and reporting what
// changed.
func (p *daemonPace) apply(cfg Config, st control.State) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	mon := cfg.monitor()
	for _, part := range control.Parts {
		on := st.IsPaused(part)
		if on == p.last.IsPaused(part) && p.last.Paused != nil {
			continue
		}
		mon.Paused(part, on)
		why := "paused by `pgconverge pause` (pgconverge.pauses); `pgconverge resume --what " + part + "` resumes it"
		switch part {
		case control.Stream:
			p.streamPaused.Store(on)
		case control.Backfill:
			hold(p.load, on, pacing.CausePaused, why)
			hold(p.backfill, on, pacing.CausePaused, why)
		case control.Verify:
			hold(p.verify, on, pacing.CausePaused, why)
		}
		if on {
			cfg.Logger.Warn("paused by the operator: nothing of it reads the source until resumed", "slot", cfg.Slot, "what", part, "fix", "pgconverge resume --what "+part)
		} else if p.last.Paused != nil {
			cfg.Logger.Info("resumed", "slot", cfg.Slot, "what", part)
		}
	}
	if st.Limits != nil && (p.last.Limits == nil || p.last.Limits.Limits != st.Limits.Limits) {
		for _, pc := range []*pacing.Pacer{p.load, p.backfill, p.verify} {
			pc.SetLimits(st.Limits.Limits)
		}
		mon.RateLimits(st.Limits.Limits)
		cfg.Logger.Info("rate limits of backfills and verifies set", "slot", cfg.Slot,
			"max_rows_per_second", st.Limits.RowsPerSecond, "max_bytes_per_second", st.Limits.BytesPerSecond, "set_by", st.Limits.SetBy)
	}
	if st.Paused == nil {
		st.Paused = []control.Paused{} // read once: later changes are logged
	}
	p.last = st
}

// lift applies the controls last read without the pauses of parts, which were just deleted from
// the ledger (the next read agrees).
func (p *daemonPace) lift(cfg Config, parts []string) {
	p.mu.Lock()
	st := control.State{Paused: []control.Paused{}, Limits: p.last.Limits}
	for _, paused := range p.last.Paused {
		if !slices.Contains(parts, paused.What) {
			st.Paused = append(st.Paused, paused)
		}
	}
	p.mu.Unlock()
	p.apply(cfg, st)
}

// hold holds (on) or releases cause on p.
func hold(p *pacing.Pacer, on bool, cause, why string) {
	if on {
		p.Hold(cause, why)
	} else {
		p.Release(cause)
	}
}

// readControls applies the ledger's controls over tgt at once: a session does so before it
// loads or streams, so that a pause recorded before a restart holds from the start.
func (s *session) readControls(ctx context.Context) error {
	st, err := control.Read(ctx, s.tgt, s.cfg.Slot)
	if err != nil {
		return err
	}
	s.cfg.pace.apply(s.cfg, st)
	return nil
}

// followControls records the daemon's rate limits (Config.Limits, set_by "run") once, then reads
// its controls from the ledger every controlEvery and applies them (daemonPace.apply) until ctx
// ends (pollEvery). A ledger not made yet (a first start) is waited for silently; other failures
// are logged at WARN when their error changes, and the last controls read stay in force.
func followControls(ctx context.Context, cfg Config) {
	recorded := false
	lastErr := ""
	pollEvery(ctx, knobOr(cfg.Knobs.ControlEvery, controlEvery), cfg.Target, "target", func(ctx context.Context, conn *pgx.Conn) error {
		if !recorded {
			if err := control.SetLimits(ctx, conn, cfg.Slot, cfg.Limits, "run"); err != nil {
				return err
			}
			recorded = true
		}
		st, err := control.Read(ctx, conn, cfg.Slot)
		if err != nil {
			return err
		}
		cfg.pace.apply(cfg, st)
		lastErr = ""
		return nil
	}, func(err error) {
		// The ledger is made by the first session (migrations).
		if !pgsession.IsCode(err, pgerrcode.UndefinedTable) && err.Error() != lastErr {
			lastErr = err.Error()
			cfg.Logger.Warn("controls (pauses, rate limits) not read from the target: the last ones read stay in force", "slot", cfg.Slot, "err", err)
		}
	})
}

// pollEvery runs step every `every` until ctx ends, over a connection to url (role "source" or
// "target") that it opens before the first step and again after a failed one; each step, the
// connection's opening included, has 10 s. A failed step is told to failed, unless ctx ended.
func pollEvery(ctx context.Context, every time.Duration, url, role string, step func(context.Context, *pgx.Conn) error, failed func(error)) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.WithoutCancel(ctx))
		}
	}()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		err := func() error {
			bounded, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if conn == nil {
				c, err := pgsession.Connect(bounded, url, role)
				if err != nil {
					return err
				}
				conn = c
			}
			return step(bounded, conn)
		}()
		if err != nil && conn != nil {
			conn.Close(context.WithoutCancel(ctx)) // its state after a failure is unknown
			conn = nil
		}
		if err != nil && ctx.Err() == nil {
			failed(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
