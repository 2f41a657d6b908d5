package cdc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// Lag thresholds (bytes of WAL between the source's WAL end and the flushed position) for the
// "caught up" log line: logged when lag falls to caughtUpLag after having exceeded behindLag.
const (
	caughtUpLag = 1 << 20
	behindLag   = 16 << 20
	// silenceLimit is how many status intervals of waiting without any message from the source
	// (each status update asks for a keepalive) make the connection dead (ErrSourceSilent).
	silenceLimit = 3
	// idleProgressEvery throttles progress writes to the target while only keepalives arrive.
	idleProgressEvery = time.Second
	// statusAfterFlushEvery throttles status updates sent right after a group was applied.
	statusAfterFlushEvery = 200 * time.Millisecond
	// confirmEvery is how often a position the target committed but the source was not told yet
	// (held back by StreamConfig.ConfirmLimit) is looked at again.
	confirmEvery = 100 * time.Millisecond
)

// loop is the state of one Run: the single goroutine that owns the replication connection.
type loop struct {
	s                *Streamer
	conn             replicationConn
	asm              *assembler
	nextStatus       time.Time
	lastStatus       time.Time
	lastIdleProgress time.Time
	// inflight is the group the target is applying, nil when none is (pipeline.go).
	inflight *applying
	// idleEnd is a WAL end from a keepalive that came while a group was held or progress writes
	// were throttled: it is recorded once idle and the throttle allows (a walsender that has sent
	// everything sends one keepalive and then waits, so dropping it would leave the watermark
	// behind for a status interval).
	idleEnd        pglogrepl.LSN
	behind         bool
	behindSince    time.Time // when the stream started or last fell behindLag behind
	behindChanges  int64     // changes received by then
	lastLog        time.Time
	lastLogChanges int64
	// lastConfirmCheck is when the loop last looked whether ConfirmLimit lets it confirm more.
	lastConfirmCheck time.Time
	// silent is how long the loop has waited in receives since the last message from the source
	// (time spent waiting for the target does not count).
	silent time.Duration
	// streaming is the state of in-progress transactions streamed by the source (streamed.go),
	// nil when the stream does not ask for them.
	streaming *streaming
}

func (l *loop) run(ctx, applyCtx context.Context) error {
	cfg := &l.s.cfg
	l.behind, l.behindSince = true, time.Now()
	l.lastLog = time.Now()
	for {
		if err := l.reap(ctx, false); err != nil {
			return err
		}
		// Whole transactions are handed to the target as soon as it is free (pipeline.go); a group
		// at its limits, or a transaction too large to hold whole, waits for the apply under way.
		rows, bytes := l.asm.pending()
		whole := !l.asm.inTxn && l.asm.txns > 0
		limit := cfg.GroupRows
		if !l.behind {
			limit = cfg.HeadGroupRows
		}
		if whole && (l.inflight == nil || rows >= limit) || bytes >= cfg.MaxPendingBytes {
			if err := l.startApply(ctx, applyCtx); err != nil {
				return err
			}
		}
		if err := l.idleProgress(ctx, applyCtx); err != nil {
			return err
		}
		now := time.Now()
		if l.s.flushed.Load() > l.s.confirmed.Load() && now.Sub(l.lastConfirmCheck) >= confirmEvery {
			// Committed but not confirmed (StreamConfig.ConfirmLimit): confirm what the limit allows now.
			l.lastConfirmCheck = now
			if l.s.confirmable() > pglogrepl.LSN(l.s.confirmed.Load()) {
				if err := l.sendStatus(ctx, false); err != nil {
					return err
				}
			}
		}
		if !now.Before(l.nextStatus) {
			// Ask for a keepalive: when idle its WAL end moves the watermark (keepalive), so an
			// idle source's coverage and lag stay current within a status interval; and an
			// answer at least every status interval tells a live source from a dead connection.
			if err := l.sendStatus(ctx, true); err != nil {
				return err
			}
		}
		if now.Sub(l.lastLog) >= cfg.StatusInterval {
			l.logProgress(now)
		}
		if st := l.streaming; st != nil && st.rowsCommit != nil {
			// A committed streamed transaction whose rows are staged is merged.
			rc := st.rowsCommit
			st.rowsCommit = nil
			if err := l.commitRows(ctx, applyCtx, rc); err != nil {
				return err
			}
			continue
		}
		if l.streaming != nil && l.streaming.replay != nil {
			// A committed streamed transaction is read back before the next message is received.
			if err := l.replayStep(ctx); err != nil {
				return err
			}
			continue
		}
		if cfg.Paused != nil && cfg.Paused() {
			// Nothing more is read from the slot while paused: what was received is still applied
			// and confirmed, and the status updates keep the walsender from timing out.
			if err := l.pausedWait(ctx); err != nil {
				return err
			}
			continue
		}
		// The read waits until the deadline, or until the apply under way ends (startApply) or ctx
		// does (run's caller), which both move the deadline to now: a deadline on the connection
		// itself, not a context per message, which pgconn would watch with a goroutine of its own.
		if err := l.conn.SetReadDeadline(l.receiveDeadline()); err != nil {
			return fmt.Errorf("receive from slot %q: %w", cfg.Slot, err)
		}
		if l.inflight != nil && l.inflight.returned.Load() {
			continue // returned before the deadline was armed: reap it first
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		waitedFrom := time.Now()
		msg, err := l.conn.ReceiveMessage(context.Background())
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if receiveTimedOut(err) {
				if l.silent += time.Since(waitedFrom); l.silent > silenceLimit*cfg.StatusInterval {
					return fmt.Errorf("receive from slot %q: %w: nothing for %s although a keepalive was asked for every %s",
						cfg.Slot, ErrSourceSilent, l.silent.Round(time.Second), cfg.StatusInterval)
				}
				continue
			}
			return fmt.Errorf("receive from slot %q: %w", cfg.Slot, err)
		}
		l.silent = 0
		if err := l.handle(ctx, applyCtx, msg); err != nil {
			return err
		}
	}
}

// pausePoll is how often a paused stream looks whether it was resumed.
const pausePoll = 250 * time.Millisecond

// pausedWait waits while the stream is paused (StreamConfig.Paused): until the next status update
// is due or pausePoll passed, whichever comes first; it returns ctx's error when ctx ends first.
func (l *loop) pausedWait(ctx context.Context) error {
	t := time.NewTimer(min(time.Until(l.nextStatus), pausePoll))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// handle processes one message from the server.
func (l *loop) handle(ctx, applyCtx context.Context, msg pgproto3.BackendMessage) error {
	switch msg := msg.(type) {
	case *pgproto3.CopyData:
		if len(msg.Data) == 0 {
			return errors.New("empty CopyData from the source")
		}
		switch msg.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
			if err != nil {
				return fmt.Errorf("parse keepalive: %w", err)
			}
			return l.keepalive(ctx, applyCtx, ka)
		case pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(msg.Data[1:])
			if err != nil {
				return fmt.Errorf("parse XLogData: %w", err)
			}
			return l.xlogData(ctx, xld)
		}
		return nil
	case *pgproto3.ErrorResponse:
		err := pgconn.ErrorResponseToPgError(msg)
		if msg.Code == pgerrcode.UndefinedObject {
			// Once streaming, the object pgoutput looks up and may not find is the publication.
			return fmt.Errorf("source ended replication on slot %q: %w: %w; the publication was dropped (and maybe created again) while the slot still needed it, and PostgreSQL cannot decode past that point: drop the slot (SELECT pg_drop_replication_slot('%s')) and restart, and pgconverge reloads every table",
				l.s.cfg.Slot, ErrPublicationMissing, err, l.s.cfg.Slot)
		}
		return fmt.Errorf("source ended replication on slot %q: %w", l.s.cfg.Slot, err)
	case *pgproto3.CopyDone:
		return fmt.Errorf("source ended replication on slot %q (CopyDone)", l.s.cfg.Slot)
	}
	return nil
}

func (l *loop) xlogData(ctx context.Context, xld pglogrepl.XLogData) error {
	// A logical message's WALStart is the LSN of the change it carries (a commit's end); adding
	// its length, as physical replication does, would report more WAL written than was sent, and
	// the walsender sends no keepalive while the reported write position is not behind what it
	// sent (PG15 walsender.c, WalSndWaitForWal): an idle watermark would then wait for the next
	// status interval.
	if uint64(xld.WALStart) > l.s.received.Load() {
		l.s.received.Store(uint64(xld.WALStart))
	}
	if staged, err := l.streamMessage(ctx, xld.WALData); staged || err != nil {
		if err != nil {
			return fmt.Errorf("streamed pgoutput message at %s: %w", xld.WALStart, err)
		}
		return nil
	}
	m, err := decode(xld.WALData)
	if err != nil {
		return fmt.Errorf("decode pgoutput message at %s: %w", xld.WALStart, err)
	}
	if k := l.s.cfg.Knobs.OnMessage; k != nil {
		k(m)
	}
	committed, err := l.asm.handle(m)
	if err != nil {
		return err
	}
	l.s.changes.Store(l.asm.changes)
	if !committed {
		return nil
	}
	l.s.transactions.Store(l.asm.committed)
	return nil
}

// keepalive answers a keepalive and, when nothing is held, moves the flushed position to the
// server's WAL end: every change before it was sent and applied, so an idle source does not keep
// WAL for the slot. The move is recorded in the target before it is reported.
func (l *loop) keepalive(ctx, applyCtx context.Context, ka pglogrepl.PrimaryKeepaliveMessage) error {
	l.noteServerEnd(ka.ServerWALEnd)
	// Between transactions, everything before the keepalive's WAL end was sent: once the held
	// group is applied, the watermark may move there.
	if !l.asm.inTxn && ka.ServerWALEnd > pglogrepl.LSN(l.s.flushed.Load()) {
		l.idleEnd = max(l.idleEnd, ka.ServerWALEnd)
		if err := l.idleProgress(ctx, applyCtx); err != nil {
			return err
		}
	} else if l.idle() {
		l.checkCaughtUp()
	}
	if ka.ReplyRequested {
		return l.sendStatus(ctx, false)
	}
	return nil
}

// idle reports whether no source transaction is held, half received or being applied.
func (l *loop) idle() bool {
	rows, _ := l.asm.pending()
	return !l.asm.inTxn && rows == 0 && l.inflight == nil
}

// idleProgress records the keepalives' WAL end (idleEnd) as applied once the throttle allows and
// nothing is held: every change before it was sent and applied, so an idle source's watermark
// stays current and does not keep WAL for the slot. The move is recorded in the target before it
// is reported. A keepalive that came while a group was held or the throttle was on is recorded
// later by the run loop, which wakes for it (receiveDeadline).
func (l *loop) idleProgress(ctx, applyCtx context.Context) error {
	if l.idleEnd <= pglogrepl.LSN(l.s.flushed.Load()) || !l.idle() || time.Since(l.lastIdleProgress) < idleProgressEvery {
		return nil
	}
	end := l.idleEnd
	if err := l.s.cfg.Apply(applyCtx, nil, end); err != nil {
		return err
	}
	l.lastIdleProgress = time.Now()
	l.s.flushed.Store(uint64(end))
	l.checkCaughtUp()
	return l.sendStatus(ctx, false)
}

func (l *loop) noteServerEnd(lsn pglogrepl.LSN) {
	if uint64(lsn) > l.s.serverEnd.Load() {
		l.s.serverEnd.Store(uint64(lsn))
	}
}

// sendStatus reports the positions: written = received, flushed = applied = what the target
// committed (never more), bounded by StreamConfig.ConfirmLimit.
func (l *loop) sendStatus(ctx context.Context, reply bool) error {
	st := l.s.Stats()
	write := st.Received
	if write < st.Flushed {
		write = st.Flushed
	}
	flush := l.s.confirmable()
	err := l.conn.SendStandbyStatusUpdate(ctx, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: write, WALFlushPosition: flush, WALApplyPosition: flush, ReplyRequested: reply,
	})
	if err != nil {
		return fmt.Errorf("send standby status update on slot %q: %w", l.s.cfg.Slot, err)
	}
	l.s.confirmed.Store(uint64(flush))
	l.lastStatus = time.Now()
	l.nextStatus = l.lastStatus.Add(l.s.cfg.StatusInterval)
	return nil
}

func (l *loop) checkCaughtUp() {
	st := l.s.Stats()
	lag := st.Lag()
	if l.behind && lag <= caughtUpLag {
		l.behind = false
		secs := time.Since(l.behindSince).Seconds()
		caughtUp := st.Changes - l.behindChanges
		l.s.cfg.Logger.Info("caught up", "slot", l.s.cfg.Slot, "flushed_lsn", st.Flushed.String(),
			"source_lsn", st.SourceWALEnd.String(), "lag_bytes", lag, "catch_up_changes", caughtUp,
			"catch_up_seconds", fmt.Sprintf("%.1f", secs), "catch_up_changes_per_s", int64(float64(caughtUp)/max(secs, 0.001)))
	} else if !l.behind && lag > behindLag {
		l.behind, l.behindSince, l.behindChanges = true, time.Now(), st.Changes
	}
}

func (l *loop) logProgress(now time.Time) {
	st := l.s.Stats()
	secs := now.Sub(l.lastLog).Seconds()
	rate := 0.0
	if secs > 0 {
		rate = float64(st.Changes-l.lastLogChanges) / secs
	}
	l.lastLog, l.lastLogChanges = now, st.Changes
	l.s.cfg.Logger.Info("stream progress", "slot", l.s.cfg.Slot, "flushed_lsn", st.Flushed.String(),
		"confirmed_lsn", st.Confirmed.String(), "source_lsn", st.SourceWALEnd.String(), "lag_bytes", st.Lag(), "transactions", st.Transactions,
		"changes", st.Changes, "changes_per_s", int64(rate))
}
