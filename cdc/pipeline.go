package cdc

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/jackc/pglogrepl"
)

// applying is a group the target applies in a goroutine of its own while the loop receives the
// next one: at most one is under way, so groups commit in order, and the group held meanwhile
// grows with what arrives during the apply. Near the head of the stream that is a transaction or
// two, so each is applied as soon as it arrives; while catching up it is as large as the limits
// allow (StreamConfig.GroupRows, MaxPendingBytes), so commits are few. This is group commit
// applied to a replication consumer.
type applying struct {
	batches  []arrow.RecordBatch
	progress pglogrepl.LSN
	toast    map[string]toastInsert
	// rows, when set, is the streamed transaction whose staged rows the apply merges
	// (streamedrows.go), in place of batches.
	rows *rowsCommit
	// returned is set once the apply returned; the goroutine then wakes the loop from the
	// receive it may wait in (loop.wake). The loop looks at it after arming its read deadline,
	// so that a wake-up before the deadline was armed is not lost.
	returned atomic.Bool
	// exited is closed after that wake-up, the goroutine's last use of the connection, with err
	// set before: the group is reaped only then.
	exited chan struct{}
	err    error
}

// startApply hands the held group to the target, first waiting for the apply under way, if any.
// It does nothing when nothing is held and the progress would not move.
func (l *loop) startApply(ctx, applyCtx context.Context) error {
	if err := l.reap(ctx, true); err != nil {
		return err
	}
	changes, _ := l.asm.pending()
	head := !l.behind
	batches, end := l.asm.take()
	flushed := pglogrepl.LSN(l.s.flushed.Load())
	progress := max(flushed, end)
	if len(batches) == 0 && progress == flushed {
		return nil
	}
	a := &applying{batches: batches, progress: progress, toast: l.asm.takeToastInserts()}
	a.exited = make(chan struct{})
	l.inflight = a
	go func() {
		defer close(a.exited)
		if k := l.s.cfg.Knobs.OnGroup; k != nil {
			k(changes, head)
		}
		a.err = l.s.cfg.Apply(applyCtx, batches, progress)
		a.returned.Store(true)
		l.wake()
	}()
	return nil
}

// reap finishes the apply under way once it returned (waiting for it when wait is set): it
// releases the group's batches, returns the apply's error, or moves the flushed position and
// schedules the status update that reports it. While it waits it keeps sending status updates at
// the status interval, so that the walsender does not time the connection out behind a slow
// target (wal_sender_timeout).
func (l *loop) reap(ctx context.Context, wait bool) error {
	a := l.inflight
	if a == nil {
		return nil
	}
	for wait {
		timer := time.NewTimer(time.Until(l.nextStatus))
		select {
		case <-a.exited:
			wait = false
		case <-timer.C:
			if err := l.sendStatus(ctx, false); err != nil {
				timer.Stop()
				<-a.exited
				l.release(a)
				return err
			}
		}
		timer.Stop()
	}
	select {
	case <-a.exited:
	default:
		return nil
	}
	l.release(a)
	if a.err != nil {
		return a.err
	}
	for table, ti := range a.toast {
		l.s.cfg.Logger.Warn("the source sent INSERTs without some TOASTed values (PostgreSQL 15 does so for an UPDATE that moves a row into the publication's row filter, with a value it left unchanged): the target rows lack those values, NULL meanwhile and named in _cdc_unknown, until they are read again from a snapshot (the daemon does so at once; else pgconverge verify --repair --table "+table+")",
			"table", table, "rows", ti.Rows, "first_lsn", ti.First.String(), "slot", l.s.cfg.Slot)
	}
	if a.rows != nil {
		if err := l.rowsCommitted(ctx, a.rows); err != nil {
			return err
		}
	}
	if k := l.s.cfg.Knobs.AfterApply; k != nil {
		k(a.progress)
	}
	l.s.flushed.Store(uint64(a.progress))
	l.checkCaughtUp()
	if time.Since(l.lastStatus) >= statusAfterFlushEvery {
		return l.sendStatus(ctx, false)
	}
	// Report the new position soon, not only at the next regular status update.
	if soon := l.lastStatus.Add(statusAfterFlushEvery); soon.Before(l.nextStatus) {
		l.nextStatus = soon
	}
	return nil
}

// release frees a's batches and forgets it as the apply under way.
func (l *loop) release(a *applying) {
	for _, b := range a.batches {
		b.Release()
	}
	l.inflight = nil
}

// drainApply waits for the apply under way, if any, and finishes it as reap does; Run calls it
// before it returns, so that the flushed position it reports last is what the target committed.
func (l *loop) drainApply(ctx context.Context) error {
	if l.inflight == nil {
		return nil
	}
	<-l.inflight.exited
	return l.reap(ctx, false)
}

// wake ends the receive the loop waits in, if any, at once: its read deadline moves to now
// (loop.run sets a new one before each receive). Safe to call from any goroutine.
func (l *loop) wake() { _ = l.conn.SetReadDeadline(time.Now()) }
