package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/internal/disposition"
)

// catalogWatcher is the session member that owns the session's source connection while the
// stream runs (Run, on its own goroutine): it stores the source's WAL position in walEnd, which
// the streamer reads (cdc.StreamConfig.SourceWALEnd), checks the catalog against the session's
// start, raises the confirm limit it owns (confirmLimit) to what its checks vouch for (voucher),
// and samples the slot's health. The state of its checks and of the slot warning is its own; it
// reads the session's start (tables, names, memberships, patterns, enums), a copy, and the
// stream's flushed position (flushed).
type catalogWatcher struct {
	st      sessionStart
	mon     Monitor
	src     *pgx.Conn // the session's source connection, the watcher's alone while the stream runs
	walEnd  *atomic.Uint64
	limit   *confirmLimit
	flushed func() pglogrepl.LSN
	// oids are the source oids of the session's tables, streamed and kept by snapshots, whose
	// catalog rows each probe fingerprints (cdc.ProbeCatalog).
	oids []uint32
	// checked is the fingerprint of the probe before the last full check that found nothing
	// changed: a probe with the same one vouches as that check would.
	checked string
	voucher voucher
	// slotWarned is set while the slot's health warns, logged last at slotWarnedAt
	// (sampleSlotHealth).
	slotWarned   bool
	slotWarnedAt time.Time
}

// newCatalogWatcher returns the catalog watcher of a stream of st over the session's source
// connection src, sharing walEnd and limit with the streamer, whose flushed position flushed
// reads.
func newCatalogWatcher(st sessionStart, mon Monitor, src *pgx.Conn, walEnd *atomic.Uint64, limit *confirmLimit, flushed func() pglogrepl.LSN) *catalogWatcher {
	w := &catalogWatcher{st: st, mon: mon, src: src, walEnd: walEnd, limit: limit, flushed: flushed}
	for _, t := range append(slices.Clone(st.tables), st.snapshotOnly...) {
		if t.SourceOID != 0 {
			w.oids = append(w.oids, t.SourceOID)
		}
	}
	return w
}

// The watcher's timings. walEndEvery is how often it samples the source's WAL position,
// fullCheckEvery how often it checks the catalog in full (and samples the slot's health), and
// probeEvery how often at most it probes while the stream flushed past the confirm limit, so
// that the slot is confirmed within about two probes of the target's commit. Each wakes on a
// tick of watchTick.
const (
	walEndEvery    = time.Second
	fullCheckEvery = 5 * time.Second
	probeEvery     = 200 * time.Millisecond
	watchTick      = 50 * time.Millisecond
)

// check looks at the source's catalog, in full or by a probe, and raises the confirm limit to
// what it vouches for. It reads the flushed and insert positions first, then probes the catalog
// (cdc.ProbeCatalog); when full is set or the fingerprint is not one a full check passed at, it
// checks in full (checkMemberships), after the probe: each of that check's reads sees at least
// what the probe's snapshot saw, so a check that finds nothing changed vouches for the
// probe's fingerprint too (a change and its undoing leave other row versions, so that
// fingerprint never comes back with a change in it). A check that found nothing changed vouches
// through voucher and is added to it. It returns what checkMemberships returns, or the source's
// error.
func (w *catalogWatcher) check(ctx context.Context, full bool) error {
	read := time.Now()
	insert, flushed, err := cdc.CurrentPositions(ctx, w.src)
	if err != nil {
		return err
	}
	probed := time.Now()
	probe, err := cdc.ProbeCatalog(ctx, w.src, w.st.cfg.Publication, w.oids)
	if err != nil {
		return err
	}
	if full || probe.Fingerprint != w.checked {
		if err := w.checkMemberships(ctx, insert); err != nil {
			return err
		}
		w.checked, full = probe.Fingerprint, true
	}
	if at, ok := w.voucher.vouch(probe, probed); ok && at > w.limit.get() {
		w.limit.set(at)
	}
	w.voucher.add(flushed, probe.Running, read)
	if k := w.st.cfg.Knobs.AfterCatalogCheck; k != nil {
		k(full)
	}
	return nil
}

// checkMemberships returns errMembershipChanged when a table's publication membership differs
// from the one recorded at the session's start, or, with the default selection (no --tables),
// when a table joined the publication; a *cdc.SchemaChangeError when a table's columns differ
// from its description, which no Relation message shows until the table's next change; and
// errEnumChanged when an enum the tables use changed its labels (a renamed label changes rows with
// no change pgoutput sends). before is a source position read before the check's snapshot, the
// LSN of a schema change it finds. Otherwise it returns nil: every table is published, and
// described, as at the start (check vouches for positions with it). Other errors are the
// source's.
func (w *catalogWatcher) checkMemberships(ctx context.Context, before pglogrepl.LSN) error {
	s, src := w.st, w.src
	tokens, err := cdc.Memberships(ctx, src, s.cfg.Publication, s.names)
	if err != nil {
		return err
	}
	changed, err := cdc.ChangedColumns(ctx, src, s.tables, before)
	if err != nil {
		return err
	}
	if changed != nil {
		return changed
	}
	if changed, err := s.labelsChanged(ctx, src); changed != nil || err != nil {
		return errors.Join(changed, err)
	}
	if err := s.checkStreamable(ctx, src, before); err != nil {
		return err
	}
	for n, tok := range s.memberships {
		if tokens[n] != tok {
			return fmt.Errorf("%w for table %s (ALTER PUBLICATION … DROP/ADD TABLE, the table was recreated, or a partition was attached, detached, created, dropped or truncated): restarting the session to load it again",
				errMembershipChanged, n)
		}
	}
	if len(s.patterns) > 0 {
		// A table created, renamed or given a key that a pattern matches is selected now.
		names, err := s.withMatches(ctx, src, nil, false)
		if err != nil {
			return err
		}
		for _, n := range names {
			if _, ok := s.memberships[n]; !ok && !s.keptBySnapshots(n) && !s.waitsFor(n) {
				return fmt.Errorf("%w: table %s matches a --tables pattern: restarting the session to follow it",
					errMembershipChanged, n)
			}
		}
	}
	if len(s.cfg.Tables) == 0 {
		// The default selection is the publication's tables and those no publication can carry:
		// one added to them is selected now.
		names, _, err := cdc.DefaultTables(ctx, src, s.cfg.Publication)
		if err != nil {
			return err
		}
		for _, n := range names {
			if _, ok := s.memberships[n]; !ok && !s.keptBySnapshots(n) && !s.waitsFor(n) {
				return fmt.Errorf("%w: table %s joined the default selection (publication %q, or the tables no publication can carry): restarting the session to follow it",
					errMembershipChanged, n, s.cfg.Publication)
			}
		}
	}
	return nil
}

// slotWarnEvery is how often a slot warning that persists is logged again.
const slotWarnEvery = 5 * time.Minute

// sampleSlotHealth reports the slot's health to the monitor and logs its warning (a slot at risk
// of losing WAL, unreserved or lost; coverage.SlotHealth.Assess) at WARN when it appears, every
// slotWarnEvery while it lasts, and at INFO when it clears. A failed read is logged at WARN and the
// stream goes on (the next sample tries again).
func (w *catalogWatcher) sampleSlotHealth(ctx context.Context, now pglogrepl.LSN) {
	cfg := w.st.cfg
	h, err := ReadSlotHealth(ctx, w.src, cfg.Slot, now)
	if err != nil {
		if ctx.Err() == nil {
			cfg.Logger.Warn("slot health not sampled: its metrics keep their last values", "slot", cfg.Slot, "err", err)
		}
		return
	}
	w.mon.SlotHealth(h)
	switch {
	case h.Warning != "" && (!w.slotWarned || time.Since(w.slotWarnedAt) >= slotWarnEvery):
		w.slotWarned, w.slotWarnedAt = true, time.Now()
		attrs := []any{"slot", cfg.Slot, "wal_status", h.WALStatus, "holds_bytes", h.RestartLagBytes}
		if h.SafeWALSizeBytes != nil {
			attrs = append(attrs, "safe_wal_size_bytes", *h.SafeWALSizeBytes)
		}
		cfg.Logger.Warn(h.Warning, attrs...)
	case h.Warning == "" && w.slotWarned:
		w.slotWarned = false
		cfg.Logger.Info("slot no longer at risk of losing WAL", "slot", cfg.Slot, "wal_status", h.WALStatus, "holds_bytes", h.RestartLagBytes)
	}
}

// Run watches the source until ctx ends or a check fails: every second it stores the source's
// current WAL position in walEnd (the stream's lag), every 5 s it checks the tables'
// publication membership, columns and enums (checkMemberships) and samples the slot's health
// (sampleSlotHealth, for metrics only), and between those it probes the catalog whenever the
// stream has something to confirm (check). It returns the first change that ends the session
// (errMembershipChanged, errEnumChanged,
// *cdc.SchemaChangeError), a failed read of the source as a watchError, or ctx's error when ctx
// ends.
func (w *catalogWatcher) Run(ctx context.Context) error {
	err := w.loop(ctx)
	if err == nil || ctx.Err() != nil || decide(err) == restart {
		return err
	}
	return watchError{err}
}

// watchError is a failed catalog or WAL read of the watcher: the session ends and the next one
// starts after a backoff, whatever the SQLSTATE (a catalog read can fail on a relation dropped
// meanwhile), since a session that cannot watch the source must not stream on unwatched.
type watchError struct{ err error }

// Mark says that the daemon backs off (reason "watch").
func (e watchError) Mark() disposition.Mark {
	return disposition.Mark{Action: disposition.BackOff, Reason: disposition.ReasonWatch}
}

// Error returns the failed read's message.
func (e watchError) Error() string { return "watch the source: " + e.err.Error() }

// Unwrap returns the failed read's error.
func (e watchError) Unwrap() error { return e.err }

// loop is Run's loop: on each watchTick it samples the WAL position every walEndEvery, checks
// in full every fullCheckEvery (then samples the slot's health), and otherwise probes when the
// stream flushed past the confirm limit and probeEvery passed since the last check.
func (w *catalogWatcher) loop(ctx context.Context) error {
	tick := time.NewTicker(watchTick)
	defer tick.Stop()
	var lastWALEnd, lastProbe time.Time
	lastFull := time.Now() // the first full check after fullCheckEvery; probes start at once
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		now := time.Now()
		if now.Sub(lastWALEnd) >= walEndEvery {
			if err := readWALEnd(ctx, w.src, w.walEnd); err != nil {
				return err
			}
			lastWALEnd = now
		}
		switch {
		case now.Sub(lastFull) >= knobOr(w.st.cfg.Knobs.FullCheckEvery, fullCheckEvery):
			lastFull, lastProbe = now, now
			if err := w.check(ctx, true); err != nil {
				return err
			}
			w.sampleSlotHealth(ctx, pglogrepl.LSN(w.walEnd.Load()))
		case now.Sub(lastProbe) >= probeEvery && w.flushed() > w.limit.get():
			lastProbe = now
			if err := w.check(ctx, false); err != nil {
				return err
			}
		}
	}
}
