package engine

import (
	"context"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// wantFailover says whether the daemon's slot is to be a failover slot: --failover-slot (on by
// default) on a primary source of PostgreSQL 17 or later, the first with failover slots (a
// standby's own slots cannot be failover slots; its copies of the primary's are).
func (s *session) wantFailover() bool {
	return s.cfg.FailoverSlot && pgsession.MajorVersion(s.repl) >= 17 && !s.standby
}

// alignFailover makes the existing, free slot's failover property what wantFailover says
// (ALTER_REPLICATION_SLOT): a slot created before the daemon made failover slots, or by hand,
// becomes one, and --failover-slot=false turns it off. It is logged at INFO.
func (s *session) alignFailover(ctx context.Context, slot cdc.SlotInfo) error {
	want := s.wantFailover()
	if slot.Failover == want {
		return nil
	}
	if err := pgsession.SetSlotFailover(ctx, s.repl, s.cfg.Slot, want); err != nil {
		return fmt.Errorf("%w (pass --failover-slot=%v to keep the slot as it is)", err, !want)
	}
	s.cfg.Logger.Info("changed the slot's failover property to match --failover-slot", "slot", s.cfg.Slot, "failover", want)
	return nil
}

// checkTimeline reads the source server's timeline (IDENTIFY_SYSTEM) into s.timeline, which the
// session's ledger transaction records (coverage.RecordTimeline), and refuses a source on another
// timeline than the one the slot's last session streamed from when, in the source's timeline
// history (TIMELINE_HISTORY, PostgreSQL docs §26.2.5), that timeline ended before the target's
// progress: the source is a standby promoted before it had received every change the target
// holds (synchronized_standby_slots did not name its slot, or the slot was no failover slot), and
// its WAL after the switch point holds other changes at LSNs the target has passed. A standby
// promoted at or after the target's progress, as synchronized_standby_slots ensures, passes.
func (s *session) checkTimeline(ctx context.Context) error {
	cfg := s.cfg
	cctx, done := pgsession.Call(ctx, "source") // replication commands get the statement deadline too
	id, err := pglogrepl.IdentifySystem(cctx, s.repl)
	done()
	if err != nil {
		return fmt.Errorf("identify the source server (IDENTIFY_SYSTEM): %w", err)
	}
	s.timeline = int64(id.Timeline)
	recorded, known, err := coverage.ReadTimeline(ctx, s.tgt, cfg.Slot)
	if err != nil || !known || recorded == s.timeline {
		return err
	}
	progress, known, err := apply.ReadProgress(ctx, s.tgt, cfg.Slot)
	if err != nil || !known {
		return err
	}
	var end pglogrepl.LSN
	found := false
	if id.Timeline > 1 { // timeline 1 has no history
		cctx, done := pgsession.Call(ctx, "source")
		h, err := pglogrepl.TimelineHistory(cctx, s.repl, id.Timeline)
		done()
		if err != nil {
			return fmt.Errorf("read the source's history of timeline %d (TIMELINE_HISTORY): %w", id.Timeline, err)
		}
		if end, found, err = coverage.TimelineEnd(string(h.Content), recorded); err != nil {
			return err
		}
	}
	if !found {
		return permanent(fmt.Errorf("the source is on timeline %d, which does not descend from timeline %d that slot %q streamed from: it was restored from a backup or is another copy of the cluster, and the target cannot follow it: replicate into a new target database (or drop the target tables and the pgconverge schema) to load everything again",
			id.Timeline, recorded, cfg.Slot))
	}
	if progress > end {
		return permanent(fmt.Errorf("the source is a promoted standby that left timeline %d at %s, before the target's progress %s for slot %q: the target holds changes the new primary never received, and the new primary reuses those LSNs for other changes; replicate into a new target database (or drop the target tables and the pgconverge schema) to load everything again; to fail over without this, name the standbys' physical slots in synchronized_standby_slots on the primary (docs/high-availability.md)",
			recorded, end, progress, cfg.Slot))
	}
	cfg.Logger.Info("the source is on a new timeline (a promoted standby): it left the timeline the slot streamed from at or after the target's progress, so it holds every change the target has",
		"slot", cfg.Slot, "timeline", id.Timeline, "previous_timeline", recorded, "switch_lsn", end.String(), "progress", progress.String())
	return nil
}
