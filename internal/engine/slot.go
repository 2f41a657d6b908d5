package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/backfill"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/backfillrun"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/internal/sequences"
)

// takeSlotGrace is how long a leader waits for another session to release its slot before it
// ends that session's walsender (takeSlot); takeSlotWait how long it then waits for the release.
const (
	takeSlotGrace = 10 * time.Second
	takeSlotWait  = 10 * time.Second
)

// takeSlot frees the slot another session holds (info, as read): this daemon leads it (lead), so
// whoever streams it is a daemon that lost its leadership or a client that should not use it. It
// waits takeSlotGrace for the holder to let go (a killed daemon's walsender ends at once, one
// whose lock connection failed ends its session within lease.CheckEvery), then ends the holder's
// walsender (cdc.TakeSlot: a source that has not noticed a broken network would keep it for
// wal_sender_timeout), logged at WARN. It returns the slot as read last.
func (s *session) takeSlot(ctx context.Context, info cdc.SlotInfo) (cdc.SlotInfo, error) {
	cfg := s.cfg
	cfg.Logger.Info("waiting for another session to release the slot this daemon leads", "slot", cfg.Slot,
		"source_pid", info.ActivePID, "wait", takeSlotGrace.String())
	deadline := time.Now().Add(takeSlotGrace)
	for info.ActivePID != 0 && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return info, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		var err error
		if info, err = cdc.ReadSlot(ctx, s.src, cfg.Slot); err != nil {
			return info, err
		}
	}
	if info.ActivePID == 0 {
		return info, nil
	}
	pid, err := cdc.TakeSlot(ctx, s.src, cfg.Slot, takeSlotWait)
	if err != nil {
		return info, err
	}
	if pid != 0 {
		cfg.Logger.Warn("ended the walsender that kept streaming the slot this daemon leads (a daemon that lost its leadership, or another client of the slot)",
			"slot", cfg.Slot, "source_pid", pid, "epoch", s.epoch, "waited", takeSlotGrace.String())
	}
	return cdc.ReadSlot(ctx, s.src, cfg.Slot)
}

// prepareSlot makes sure a usable slot exists, records in the coverage ledger where this
// session's stream covers what, loads the tables that need it, and returns the LSN to start
// streaming from.
//
// A slot that is missing or invalidated (cdc.SlotInfo.Lost) is created anew; when the ledger had a
// segment for it, that segment ends at the target's progress and the range up to the new slot's
// consistent point is a gap. A slot whose confirmed_flush_lsn is past the target's progress
// (another consumer, or a target restored from an older backup) streams from there, and the range
// skipped is a gap too: the stream never silently starts later than the ledger's watermark.
// Tables that never completed a backfill are loaded; tables with a gap are repaired by comparison
// (--on-gap=repair) or loaded (--on-gap=backfill). A new slot's own exported snapshot repairs and
// loads them; with an existing slot they are repaired or loaded from a fresh snapshot of a
// temporary slot (keeping what an interrupted load completed), while the main slot keeps their
// later changes.
func (s *session) prepareSlot(ctx context.Context) (pglogrepl.LSN, error) {
	cfg := s.cfg
	slot, err := cdc.ReadSlot(ctx, s.src, cfg.Slot)
	if err != nil {
		return 0, err
	}
	if slot.Exists {
		if err := slot.Usable(cfg.Slot, s.src.Config().Database); err != nil {
			return 0, permanent(err)
		}
		if slot.Busy(cfg.Slot) != nil && slot.ActivePID != 0 {
			if slot, err = s.takeSlot(ctx, slot); err != nil {
				return 0, err
			}
		}
		if err := slot.Busy(cfg.Slot); err != nil {
			return 0, err
		}
		if !slot.Lost() {
			if err := s.alignFailover(ctx, slot); err != nil {
				return 0, err
			}
		}
	}
	if slot.Exists && slot.Lost() {
		if err := cdc.DropSlot(ctx, s.src, cfg.Slot); err != nil {
			return 0, err
		}
		return s.newSlot(ctx, fmt.Sprintf("slot %q was invalidated (%s): it can no longer stream", cfg.Slot, slot.LostBecause()))
	}
	if !slot.Exists {
		return s.newSlot(ctx, fmt.Sprintf("slot %q is missing: it was dropped", cfg.Slot))
	}
	progress, known, err := apply.ReadProgress(ctx, s.tgt, cfg.Slot)
	if err != nil {
		return 0, err
	}
	loaded, err := coverage.LoadedTables(ctx, s.tgt, cfg.Slot)
	if err != nil {
		return 0, err
	}
	brk := ""
	start := progress
	switch {
	case !known:
		brk = fmt.Sprintf("the target has no progress for slot %q", cfg.Slot)
		start, loaded = slot.ConfirmedFlush, nil
	case progress < slot.ConfirmedFlush:
		brk = fmt.Sprintf("slot %q has confirmed_flush_lsn %s, past the target's progress %s: another client consumed changes from the slot, or the target was restored from an older backup",
			cfg.Slot, slot.ConfirmedFlush, progress)
		start, loaded = slot.ConfirmedFlush, nil
	}
	if err := s.recordCoverage(ctx, coverageStart{Stream: start, Break: brk}); err != nil {
		return 0, err
	}
	plan, err := s.tablesToLoad(ctx, loaded)
	if err != nil {
		return 0, err
	}
	if err := s.loadPlanned(ctx, plan, nil, start); err != nil {
		return 0, err
	}
	return start, s.publishCoverage(ctx, true)
}

// checkNotRewound refuses a source whose WAL position is behind the target's progress: it was
// restored from a backup or failed over to a standby that lacks changes the target holds, and it
// will reuse those LSNs for other changes, which the version rule would then refuse as older.
func (s *session) checkNotRewound(ctx context.Context) error {
	progress, known, err := apply.ReadProgress(ctx, s.tgt, s.cfg.Slot)
	if err != nil || !known {
		return err
	}
	now, err := cdc.CurrentLSN(ctx, s.src)
	if err != nil {
		return err
	}
	if now < progress {
		return permanent(fmt.Errorf("the source's WAL position %s is behind the target's progress %s for slot %q: the source was restored from a backup or failed over to a standby that lacks changes the target holds, and it will reuse those LSNs; the target cannot follow it: replicate into a new target database (or drop the target tables and the pgconverge schema) to load everything again",
			now, progress, s.cfg.Slot))
	}
	return nil
}

// newSlot creates the slot, records its new segment, and repairs and loads the tables that need
// it at the slot's exported snapshot. brk says why a segment the ledger had open for the slot ended.
func (s *session) newSlot(ctx context.Context, brk string) (pglogrepl.LSN, error) {
	cfg := s.cfg
	cfg.Logger.Info("creating replication slot: the source first waits for the transactions running now to end", "slot", cfg.Slot)
	failover := s.wantFailover()
	stop := pgsession.LogStandbySnapshots(ctx, s.primaryURL())
	unwatch := pgsession.WatchSlotCreation(ctx, cfg.Source, cfg.Slot, s.repl.PID(), s.reportSlotWait)
	created, err := pgsession.CreateSlot(ctx, s.repl, cfg.Slot, false, failover)
	unwatch()
	stop()
	s.mon.SlotCreationWait(cfg.Slot, pgsession.SlotWait{Slot: cfg.Slot})
	if err != nil {
		return 0, err
	}
	cfg.Logger.Info("created replication slot", "slot", cfg.Slot, "consistent_point", created.ConsistentPoint.String(), "failover", failover)
	c := created.ConsistentPoint
	if err := s.recordCoverage(ctx, coverageStart{Stream: c, Created: c, Break: brk}); err != nil {
		return 0, err
	}
	plan, err := s.tablesToLoad(ctx, nil)
	if err != nil {
		return 0, err
	}
	snap := backfill.Snapshot{Name: created.SnapshotName, LSN: c}
	if err := s.loadPlanned(ctx, plan, &snap, c); err != nil {
		return 0, err
	}
	return c, s.publishCoverage(ctx, true)
}

// loadTables backfills tables before streaming starts (a backfill run with trigger "initial" or
// "gap"): from snap when it is set (a new slot's own exported snapshot, which stays importable
// while the replication connection is idle), else from a temporary slot's. Chunks an interrupted
// load completed at an S at or above keepFrom, where the stream resumes, are kept. Its statements
// have no deadline (a chunk's COPY runs as long as it needs).
func (s *session) loadTables(ctx context.Context, tables []changebatch.Table, trigger string, snap *backfill.Snapshot, keepFrom pglogrepl.LSN) error {
	cfg := s.cfg
	ctx = pgsession.Unbound(ctx)
	what := "initial load"
	if trigger == coverage.TriggerGap {
		what = "gap backfill"
	}
	job := s.backfillJob(s.mon, tables, trigger, what)
	job.Pacer = cfg.pace.loadPacer() // before the stream: neither the WAL budget nor the stream lag holds it
	job.Slot, job.Snapshot, job.Resume, job.KeepFrom, job.Busy, job.AfterChunk, job.BeforeFenced = cfg.Slot, snap, true, keepFrom, backfillrun.BusyWait, cfg.Knobs.AfterLoadChunk, cfg.Knobs.BeforeFenced
	rep, err := backfillrun.Run(ctx, job)
	if err == nil && cfg.SyncSequences {
		sequences.SyncAfterBackfill(ctx, cfg.Source, cfg.Primary, cfg.Target, rep.Completed(tables), rep.RunID, cfg.Logger)
	}
	return err
}

// backfillJob returns a backfill of tables by the session's configuration (workers, chunk and
// batch sizes, logs, progress named what, metrics counted by mon) under its epoch, with trigger;
// the caller sets what differs: the slot, a snapshot, resuming, what to do with a busy table, the
// chunk hook.
func (s sessionStart) backfillJob(mon Monitor, tables []changebatch.Table, trigger, what string) backfillrun.Job {
	cfg := s.cfg
	return backfillrun.Job{
		Source: cfg.Source, Primary: cfg.Primary, Target: cfg.Target, Tables: tables, Trigger: trigger,
		LeaderSlot: cfg.Slot, Epoch: s.epoch, Publication: cfg.Publication,
		Workers: cfg.BackfillWorkers, ChunkRows: cfg.ChunkRows, BatchRows: backfillrun.BatchRows,
		SnapshotWarn: cfg.SnapshotWarn, Logger: cfg.Logger, Monitor: mon, CopyOnly: cfg.copyOnly,
		Progress: mon.BackfillProgress(trigger, backfillrun.NewLogProgress(cfg.Logger, what, 10*time.Second)),
		Lease:    cfg.Knobs.Lease, Pacer: cfg.pace.backfillPacer(), ChunkTimeCap: cfg.ChunkTimeCap,
	}
}

// readSlotApart reads the slot over a connection of its own, with the session's statement
// deadline: once streaming starts, the session's source connection belongs to the WAL sampler.
func (s *session) readSlotApart(ctx context.Context) (cdc.SlotInfo, error) {
	ctx = s.bounded(ctx)
	conn, err := pgsession.Connect(ctx, s.cfg.Source, "source")
	if err != nil {
		return cdc.SlotInfo{}, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return cdc.ReadSlot(ctx, conn, s.cfg.Slot)
}

// checkSlotStart returns an error wrapping errSlotMoved when the slot, now held by this session's
// walsender, no longer starts at start (readSlotApart).
func (s *session) checkSlotStart(ctx context.Context, start pglogrepl.LSN) error {
	slot, err := s.readSlotApart(ctx)
	if err != nil {
		return err
	}
	if !slot.Exists || slot.Lost() || slot.ConfirmedFlush > start {
		return fmt.Errorf("%w: slot %q (exists %v, wal_status %q, confirmed_flush_lsn %s) no longer starts at the target's progress %s; restarting the session to record the gap",
			errSlotMoved, s.cfg.Slot, slot.Exists, slot.WALStatus, slot.ConfirmedFlush, start)
	}
	return nil
}

// slotGoneCheck bounds slotGoneOr's look at the slot: the session's error waits for it.
const slotGoneCheck = 10 * time.Second

// slotGoneOr returns err, with which the session's stream ended, wrapped in errSlotLost when the
// source invalidated the slot (cdc.SlotInfo.Lost) or in errSlotMoved when it was dropped, at any
// moment of the session: during an initial load START_REPLICATION then fails (55000 "cannot read
// from logical replication slot"), while streaming the source ends the walsender. The next session
// creates the slot anew and records and backfills the gap, as for a slot found gone at its start.
// When the source did not answer, or the slot cannot be read (readSlotApart, for at most
// slotGoneCheck), err is returned as it is.
func (s *session) slotGoneOr(ctx context.Context, err error) error {
	var te *pgsession.TimeoutError
	if errors.Is(err, errSlotMoved) || errors.Is(err, errSlotLost) || errors.Is(err, cdc.ErrSourceSilent) || errors.As(err, &te) {
		return err // the source did not answer: the next session looks at the slot
	}
	cctx, cancel := context.WithTimeout(ctx, slotGoneCheck)
	defer cancel()
	slot, rerr := s.readSlotApart(cctx)
	switch {
	case rerr != nil || slot.Exists && !slot.Lost():
		return err
	case !slot.Exists:
		return fmt.Errorf("%w: slot %q was dropped: restarting the session to create it anew and record the gap (%w)", errSlotMoved, s.cfg.Slot, err)
	}
	return fmt.Errorf("%w: the source invalidated slot %q (%s) while this session used it: the next session creates it anew and backfills the gap (%w)",
		errSlotLost, s.cfg.Slot, slot.LostBecause(), err)
}

// reportSlotWait logs a wait of the slot's creation (pgsession.LogSlotWait) and gives it to the
// Monitor.
func (s *session) reportSlotWait(w pgsession.SlotWait) {
	pgsession.LogSlotWait(s.cfg.Logger)(w)
	s.mon.SlotCreationWait(w.Slot, w)
}
