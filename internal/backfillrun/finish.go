package backfillrun

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/coverage"
)

// conflictAttempts bounds how often a backfill transaction is tried when it loses a deadlock or a
// serialization conflict with a concurrent writer (the stream, or a session of the target's).
const conflictAttempts = 3

// conflictBackoff is the wait before a retry of a lost conflict, times the attempt number.
const conflictBackoff = 200 * time.Millisecond

// retryConflict reports whether err is a lost deadlock (40P01) or serialization conflict (40001)
// that attempt (from 1) of what at table may be retried after: it counts it (Monitor and the
// run's report), logs it at WARN and waits attempt × conflictBackoff first. It returns false for
// any other error, after the last attempt, or when ctx ends while it waits.
func (w *backfillWorker) retryConflict(ctx context.Context, table, what string, attempt int, err error) bool {
	var pgErr *pgconn.PgError
	if attempt >= conflictAttempts || !errors.As(err, &pgErr) ||
		(pgErr.Code != pgerrcode.DeadlockDetected && pgErr.Code != pgerrcode.SerializationFailure) {
		return false
	}
	w.mon.BackfillConflict(table)
	if w.conflicts != nil {
		w.conflicts.Add(1)
	}
	wait := time.Duration(attempt) * conflictBackoff
	w.log.Warn("a backfill transaction lost a conflict with a concurrent writer; retrying", "table", table, "what", what,
		"attempt", attempt, "retry_in", wait.String(), "err", err)
	select {
	case <-time.After(wait):
		return true
	case <-ctx.Done():
		return false
	}
}

// finishIfComplete completes tr's backfill once its plan is complete and every chunk completed:
// in one transaction it records the table backfilled at the smallest S of its chunks, raises the
// table's fence to that S and turns every live row older than it into a tombstone (a row no chunk
// read: the source had deleted it), unless tr.unwritten says there can be none. It returns how
// many rows it turned, or -1 when tr is not complete (or another worker finished it). A
// transaction that loses a deadlock or a serialization conflict is retried (retryConflict).
func (w *backfillWorker) finishIfComplete(ctx context.Context, tr *tableRun, log *slog.Logger) (int64, error) {
	tr.mu.Lock()
	complete := tr.planned && tr.open == 0 && !tr.finished
	tr.finished = tr.finished || complete
	tr.mu.Unlock()
	if !complete {
		return -1, nil
	}
	for attempt := 1; ; attempt++ {
		n, err := w.finish(ctx, tr, log)
		if err == nil || !w.retryConflict(ctx, tr.t.String(), "the completion of the table's backfill", attempt, err) {
			return n, err
		}
	}
}

// finish completes tr's backfill in one transaction (finishIfComplete).
func (w *backfillWorker) finish(ctx context.Context, tr *tableRun, log *slog.Logger) (int64, error) {
	tx, err := w.ap.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if w.epoch != 0 {
		if err := apply.CheckLeaderTx(ctx, tx.Conn(), w.slot, w.epoch); err != nil {
			return 0, err
		}
	}
	s, err := coverage.FinishTableBackfill(ctx, tx.Conn(), tr.id)
	if err != nil {
		return 0, err
	}
	var n int64
	if tr.unwritten {
		// Nothing older than S can be there: skip scanning the whole table for it.
		err = tx.RaiseFence(ctx, tr.t, changebatch.Version{LSN: s})
	} else {
		n, err = tx.Fence(ctx, tr.t, changebatch.Version{LSN: s})
	}
	if err != nil {
		return 0, err
	}
	if tr.keyDeferred {
		began := time.Now()
		built, err := apply.RestoreKey(ctx, tx.Conn(), tr.t)
		if err != nil {
			return 0, err
		}
		if built { // else another process built it meanwhile (a daemon or a backfill starting)
			log.Info("built the primary key after the bulk load", "table", tr.t.String(), "seconds", fmt.Sprintf("%.1f", time.Since(began).Seconds()))
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	tr.mu.Lock()
	tr.result = &TableResult{Table: tr.t.String(), BackfilledAt: s, Rows: tr.rows}
	tr.mu.Unlock()
	log.Info("backfilled table", "table", tr.t.String(), "rows", tr.rows, "backfilled_at", s.String(), "tombstoned_absent", n)
	return n, nil
}
