package engine

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
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

// readWALEnd stores the source's current WAL position (cdc.CurrentLSN, read on src) in lsn.
func readWALEnd(ctx context.Context, src *pgx.Conn, lsn *atomic.Uint64) error {
	l, err := cdc.CurrentLSN(ctx, src)
	if err != nil {
		return err
	}
	lsn.Store(uint64(l))
	return nil
}

// keptBySnapshots reports whether table n is one of the session's tables kept by snapshots only
// (changebatch.Table.SnapshotOnly): it is selected, not streamed; checkStreamable notices when it
// becomes streamable.
func (s sessionStart) keptBySnapshots(n changebatch.TableName) bool {
	return slices.ContainsFunc(s.snapshotOnly, func(t changebatch.Table) bool { return t.TableName == n })
}
