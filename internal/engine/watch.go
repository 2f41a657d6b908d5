package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/disposition"
)

// syncMemberships records each table's publication membership in the target; a table whose
// membership changed since it was recorded (it left the publication and came back, or was
// recreated) is marked for loading. It notes, for the coverage ledger, a source position read
// before the memberships (up to which unchanged tables were certainly published) and one read
// after (from which every table certainly is).
func (s *session) syncMemberships(ctx context.Context, names []changebatch.TableName) error {
	before, err := cdc.CurrentLSN(ctx, s.src)
	if err != nil {
		return err
	}
	tokens, err := cdc.Memberships(ctx, s.src, s.cfg.Publication, names)
	if err != nil {
		return err
	}
	after, err := cdc.CurrentLSN(ctx, s.src)
	if err != nil {
		return err
	}
	for _, t := range s.tables {
		n := t.TableName
		tok := tokens[n]
		if tok == "" {
			return fmt.Errorf("table %s is not in publication %q after it was added: it was removed concurrently; restart", t, s.cfg.Publication)
		}
		old, oldSlot, err := coverage.SyncMembership(ctx, s.tgt, t, tok)
		if err == nil && old != "" && old != tok && oldSlot == "" {
			// The slot's mark is cleared when its daemon let the table go: its last span says.
			oldSlot, err = coverage.LastFollower(ctx, s.tgt, n)
		}
		switch {
		case err != nil:
			return err
		case old != "" && old != tok && oldSlot != "" && oldSlot != s.cfg.Slot:
			s.cfg.Logger.Info("the table was followed by another slot until now: this slot's stream takes it, and it is loaded again",
				"table", t.String(), "from_slot", oldSlot, "publication", s.cfg.Publication)
		case old != "" && old != tok:
			s.cfg.Logger.Warn("the table's publication membership changed since it was loaded (it left the publication and came back, was recreated, or the publication was altered): loading it again",
				"table", t.String(), "publication", s.cfg.Publication)
		}
	}
	s.names, s.memberships = names, tokens
	s.memberBefore, s.memberAfter = before, after
	return nil
}

// catalogWatcher is the session member that owns the session's source connection while the
// stream runs (Run, on its own goroutine): it stores the source's WAL position in walEnd, which
// the streamer reads (cdc.StreamConfig.SourceWALEnd), checks the catalog against the session's
// start, raises the confirm limit it owns (confirmLimit) after each check that found nothing
// changed, and samples the slot's health. The state of its checks and of the slot warning is its
// own; it reads the session's start (tables, names, memberships, patterns, enums), a copy.
type catalogWatcher struct {
	st     sessionStart
	mon    Monitor
	src    *pgx.Conn // the session's source connection, the watcher's alone while the stream runs
	walEnd *atomic.Uint64
	limit  *confirmLimit
	// lastCheck is the source position read before the previous check that found nothing
	// changed, 0 before the first.
	lastCheck pglogrepl.LSN
	// slotWarned is set while the slot's health warns, logged last at slotWarnedAt
	// (sampleSlotHealth).
	slotWarned   bool
	slotWarnedAt time.Time
}

// checkMemberships returns errMembershipChanged when a table's publication membership differs
// from the one recorded at the session's start, or, with the default selection (no --tables),
// when a table joined the publication; a *cdc.SchemaChangeError when a table's columns differ
// from its description, which no Relation message shows until the table's next change; and
// errEnumChanged when an enum the tables use changed its labels (a renamed label changes rows with
// no change pgoutput sends). Otherwise every table was published, as at the start, up to the
// source position read before the previous check (a commit before it was visible to this check,
// however late its commit record was written); that position becomes the confirm limit
// (confirmLimit), which the stream records
// in the ledger with its next transaction (spanConfirmer). Other errors are the source's.
func (w *catalogWatcher) checkMemberships(ctx context.Context) error {
	s, src := w.st, w.src
	before, err := cdc.CurrentLSN(ctx, src)
	if err != nil {
		return err
	}
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
	if w.lastCheck != 0 {
		w.limit.set(w.lastCheck)
	}
	w.lastCheck = before
	return nil
}

// labelsChanged returns an error wrapping errEnumChanged when an enum the tables use has other
// labels on the source (read over conn) than at the session's start.
func (s sessionStart) labelsChanged(ctx context.Context, conn *pgx.Conn) (changed, err error) {
	if len(s.enums) == 0 {
		return nil, nil
	}
	labels, err := cdc.EnumLabels(ctx, conn, slices.Collect(maps.Keys(s.enums)))
	if err != nil {
		return nil, err
	}
	for name, l := range s.enums {
		if !slices.Equal(labels[name], l) {
			return fmt.Errorf("%w: %s now has labels %q (had %q): restarting the session to change the target's type alike",
				errEnumChanged, name, labels[name], l), nil
		}
	}
	return nil, nil
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

// readWALEnd stores the source's current WAL position (cdc.CurrentLSN, read on src) in lsn.
func readWALEnd(ctx context.Context, src *pgx.Conn, lsn *atomic.Uint64) error {
	l, err := cdc.CurrentLSN(ctx, src)
	if err != nil {
		return err
	}
	lsn.Store(uint64(l))
	return nil
}

// Run watches the source until ctx ends or a check fails: every second it stores the source's
// current WAL position in walEnd (the stream's lag), every 5 s it checks the tables'
// publication membership, columns and enums (checkMemberships) and samples the slot's health
// (sampleSlotHealth, for metrics only). It returns the first change that ends the session (errMembershipChanged, errEnumChanged,
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

// loop is Run's loop.
func (w *catalogWatcher) loop(ctx context.Context) error {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for n := 1; ; n++ {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		if err := readWALEnd(ctx, w.src, w.walEnd); err != nil {
			return err
		}
		if n%5 != 0 {
			continue
		}
		if err := w.checkMemberships(ctx); err != nil {
			return err
		}
		w.sampleSlotHealth(ctx, pglogrepl.LSN(w.walEnd.Load()))
	}
}

// keptBySnapshots reports whether table n is one of the session's tables kept by snapshots only
// (changebatch.Table.SnapshotOnly): it is selected, not streamed; checkStreamable notices when it
// becomes streamable.
func (s sessionStart) keptBySnapshots(n changebatch.TableName) bool {
	return slices.ContainsFunc(s.snapshotOnly, func(t changebatch.Table) bool { return t.TableName == n })
}
