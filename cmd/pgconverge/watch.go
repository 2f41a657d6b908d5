package main

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
)

// syncMemberships records each table's publication membership in the target; a table whose
// membership changed since it was recorded (it left the publication and came back, or was
// recreated) is marked for loading. It notes, for the coverage ledger, a source position read
// before the memberships (up to which unchanged tables were certainly published) and one read
// after (from which every table certainly is).
func (s *session) syncMemberships(ctx context.Context, names []cdc.TableName) error {
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
		n := cdc.TableName{Schema: t.Schema, Name: t.Name}
		tok := tokens[n]
		if tok == "" {
			return fmt.Errorf("table %s is not in publication %q after it was added: it was removed concurrently; restart", t, s.cfg.Publication)
		}
		old, err := apply.SyncMembership(ctx, s.tgt, t, tok)
		if err != nil {
			return err
		}
		if old != "" && old != tok {
			s.cfg.Logger.Warn("the table's publication membership changed since it was loaded (it left the publication and came back, was recreated, or the publication was altered): loading it again",
				"table", t.String(), "publication", s.cfg.Publication)
		}
	}
	s.names, s.memberships = names, tokens
	s.memberBefore, s.memberAfter = before, after
	return nil
}

// checkMemberships ends the session (errMembershipChanged) when a table's publication membership
// differs from the one recorded at the session's start, or, with the default selection (no
// --tables), when a table joined the publication; and with a *cdc.SchemaChangeError when a
// table's columns differ from its description, which no Relation message shows until the table's
// next change; and with errEnumChanged when an enum the tables use changed its labels (a renamed
// label changes rows with no change pgoutput sends). Otherwise every table was published, as
// at the start, up to the source position read before the previous check (a commit before it was
// visible to this check, however late its commit record was written); that position goes to the
// stream, which records it in the ledger with its next transaction (coverage.ConfirmSpans).
func (s *session) checkMemberships(ctx context.Context) {
	before, err := cdc.CurrentLSN(ctx, s.src)
	if err != nil {
		return // a failing source ends the stream by itself
	}
	tokens, err := cdc.Memberships(ctx, s.src, s.cfg.Publication, s.names)
	if err != nil {
		return
	}
	changed, err := cdc.ChangedColumns(ctx, s.src, s.tables, before)
	if err != nil {
		return
	}
	if changed != nil {
		s.cancel(changed)
		return
	}
	if len(s.enums) > 0 {
		labels, err := cdc.EnumLabels(ctx, s.src, slices.Collect(maps.Keys(s.enums)))
		if err != nil {
			return
		}
		for name, l := range s.enums {
			if !slices.Equal(labels[name], l) {
				s.cancel(fmt.Errorf("%w: %s now has labels %q (had %q): restarting the session to change the target's type alike",
					errEnumChanged, name, labels[name], l))
				return
			}
		}
	}
	for n, tok := range s.memberships {
		if tokens[n] != tok {
			s.cancel(fmt.Errorf("%w for table %s (ALTER PUBLICATION … DROP/ADD TABLE, the table was recreated, or a partition was attached, detached, created, dropped or truncated): restarting the session to load it again",
				errMembershipChanged, n))
			return
		}
	}
	if len(s.cfg.Tables) == 0 {
		// The default selection is the publication's tables: one added to it is selected now.
		names, _, err := cdc.DefaultTables(ctx, s.src, s.cfg.Publication)
		if err != nil {
			return
		}
		for _, n := range names {
			if _, ok := s.memberships[n]; !ok {
				s.cancel(fmt.Errorf("%w: table %s joined publication %q: restarting the session to load and stream it",
					errMembershipChanged, n, s.cfg.Publication))
				return
			}
		}
	}
	if s.lastCheck != 0 {
		s.confirmed.Store(uint64(s.lastCheck))
	}
	s.lastCheck = before
}

// sampleSlotHealth sets the slot health metrics, when metrics are served.
func (s *session) sampleSlotHealth(ctx context.Context, now pglogrepl.LSN) {
	if s.cfg.Metrics == nil {
		return
	}
	if h, err := coverage.ReadSlotHealth(ctx, s.src, s.cfg.Slot, now); err == nil {
		s.cfg.Metrics.setSlot(h)
	}
}

// sampleWALEnd reads the source's current WAL position (cdc.CurrentLSN) now and then every second on the source
// connection, which is otherwise idle while streaming, until stop is called; every 5 s it also
// checks the tables' publication membership (checkMemberships). The returned function
// gives the last value read; errors leave it unchanged (the stream reports a failed source).
func (s *session) sampleWALEnd(ctx context.Context) (last func() pglogrepl.LSN, stop func()) {
	var lsn atomic.Uint64
	read := func(ctx context.Context) {
		if l, err := cdc.CurrentLSN(ctx, s.src); err == nil {
			lsn.Store(uint64(l))
		}
	}
	read(ctx)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for n := 1; ; n++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				read(ctx)
				if n%5 == 0 {
					s.checkMemberships(ctx)
					s.sampleSlotHealth(ctx, pglogrepl.LSN(lsn.Load()))
				}
			}
		}
	}()
	return func() pglogrepl.LSN { return pglogrepl.LSN(lsn.Load()) }, func() { cancel(); <-done }
}
