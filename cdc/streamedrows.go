package cdc

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// Rows staged ahead of the commit. A streamed transaction's row changes are decoded as they
// arrive, by an assembler of the transaction's own, and staged as rows (Stager.StageRows) at
// versions whose LSN is a placeholder, not as messages; at the Stream Commit the target merges them
// set-based at the commit's LSN (StreamConfig.ApplyStreamed), one statement per table, instead of
// decoding every message then. That is the common case, a bulk INSERT, UPDATE or DELETE of keyed
// tables. From the first change only the general path handles (rowsRefusal: a TRUNCATE, a schema
// change, a keyless table, a TOASTed value left out, or a change decoded with an error, which the
// general path reports in order), the transaction's messages are staged (streamed.go): at the
// commit the rows before it are merged first, committed with the progress held, and then the
// messages are read back and applied after them, their ordinals following the rows'. The rows
// merged first are what the later changes find in the target (an unchanged TOASTed value of a row
// the transaction wrote before, say), as if the transaction were applied in parts. Relation and
// Type messages are always staged as messages too, for such a rest to decode with.

// rowsRefusal returns why message m of a streamed transaction cannot be staged as rows, "" when it
// can. a is the transaction's assembler, for the tables it replicates.
func rowsRefusal(a *assembler, m pglogrepl.Message) string {
	switch m := m.(type) {
	case *pglogrepl.RelationMessage:
		t, ok := a.described(m)
		switch {
		case !ok:
			return ""
		case t.Keyless:
			return "it changes " + t.String() + ", a table without a key"
		case compareRelation(t, m, 0) != nil:
			return "the schema of " + t.String() + " changed"
		}
	case *pglogrepl.InsertMessage:
		if leftOut(m.Tuple) {
			return "an INSERT left a TOASTed value out"
		}
	case *pglogrepl.UpdateMessage:
		if leftOut(m.NewTuple) {
			return "an UPDATE left a TOASTed value out as unchanged"
		}
	case *pglogrepl.TruncateMessage:
		return "it truncates a table"
	}
	return ""
}

// leftOut reports whether tup has a value sent as unchanged TOAST.
func leftOut(tup *pglogrepl.TupleData) bool {
	return tup != nil && slices.ContainsFunc(tup.Columns, func(c *pglogrepl.TupleDataColumn) bool { return c.DataType == pglogrepl.TupleDataTypeToast })
}

// stageRows decodes data, a message of subtransaction subXid of the open streamed transaction t
// (xid), into t's rows, staging them when they pass stageBatchBytes. It returns true when the
// message went into the rows, false when t takes, or took, the general path.
func (l *loop) stageRows(ctx context.Context, xid, subXid uint32, t *openTxn, data []byte) (bool, error) {
	if l.s.cfg.ApplyStreamed == nil || t.general != "" {
		return false, nil
	}
	if t.rows == nil {
		cfg := &l.s.cfg
		t.rows = newAssembler(memory.DefaultAllocator, cfg.Tables, cfg.DescribedAt, cfg.ReloadFences)
		if _, err := t.rows.handle(&pglogrepl.BeginMessage{Xid: xid}); err != nil {
			return false, err
		}
	}
	m, err := decode(data)
	if err != nil {
		return false, l.takeGeneralPath(ctx, xid, t, err.Error())
	}
	if why := rowsRefusal(t.rows, m); why != "" {
		return false, l.takeGeneralPath(ctx, xid, t, why)
	}
	switch m.(type) {
	case *pglogrepl.InsertMessage, *pglogrepl.UpdateMessage, *pglogrepl.DeleteMessage:
		if _, insert := m.(*pglogrepl.InsertMessage); !insert && !t.changed {
			// The rows held are all INSERTs: staged as such.
			if err := l.flushRows(ctx, xid, t); err != nil {
				return false, err
			}
			t.changed = true
		}
		if subXid != t.sub {
			// Staged rows carry their subtransaction, for an abort of it to discard.
			if err := l.flushRows(ctx, xid, t); err != nil {
				return false, err
			}
			t.sub = subXid
		}
	}
	seq := t.rows.seq
	if _, err := t.rows.handle(m); err != nil {
		t.rows.seq = seq // the change is the general path's
		return false, l.takeGeneralPath(ctx, xid, t, err.Error())
	}
	if _, bytes := t.rows.pending(); bytes >= stageBatchBytes {
		return true, l.flushRows(ctx, xid, t)
	}
	return true, nil
}

// flushRows stages the rows t's assembler holds, of subtransaction t.sub.
func (l *loop) flushRows(ctx context.Context, xid uint32, t *openTxn) error {
	if t.rows == nil {
		return nil
	}
	batches, _ := t.rows.take()
	defer func() {
		for _, b := range batches {
			b.Release()
		}
	}()
	for _, b := range batches {
		if err := l.streaming.stager.StageRows(ctx, xid, t.sub, b, !t.changed); err != nil {
			return fmt.Errorf("stage rows of streamed transaction %d on the target: %w", xid, err)
		}
	}
	if k := l.s.cfg.Knobs.AfterStage; k != nil && len(batches) > 0 {
		if err := l.streaming.stager.Flush(ctx); err != nil {
			return fmt.Errorf("stage rows of streamed transaction %d on the target: %w", xid, err)
		}
		k()
	}
	return nil
}

// takeGeneralPath has the rest of the open streamed transaction t (xid) staged as messages and
// applied from them at its commit, for the reason why; the rows decoded so far are staged.
func (l *loop) takeGeneralPath(ctx context.Context, xid uint32, t *openTxn, why string) error {
	if err := l.flushRows(ctx, xid, t); err != nil {
		return err
	}
	t.general, t.typed = why, t.rows.seq
	l.asm.changes += t.rows.changes
	t.releaseRows()
	l.s.cfg.Logger.Info("streamed transaction: its changes from here on are decoded at its commit, not ahead", "slot", l.s.cfg.Slot,
		"xid", xid, "because", why, "changes_staged_as_rows", t.typed)
	return nil
}

// releaseRows frees t's assembler, if any.
func (t *openTxn) releaseRows() {
	if t.rows != nil {
		t.rows.release()
		t.rows = nil
	}
}

// rowsCommit is a streamed transaction committed with changes staged as rows, to be merged.
type rowsCommit struct {
	commit *pglogrepl.StreamCommitMessageV2
	began  time.Time
	// then, when set, reads back the messages staged after the rows, applied after them.
	then *replaying
}

// commitRows starts the merge of the rows staged by the streamed transaction rc commits: after the
// group held before it is applied, the target merges them in a goroutine as it applies groups
// (pipeline.go), and the loop receives meanwhile. When messages follow the rows, the merge keeps
// the progress where it is, and the loop waits for it and then reads the messages back.
func (l *loop) commitRows(ctx, applyCtx context.Context, rc *rowsCommit) error {
	if err := l.startApply(ctx, applyCtx); err != nil {
		return err
	}
	if err := l.reap(ctx, true); err != nil {
		return err
	}
	m := rc.commit
	progress := pglogrepl.LSN(l.s.flushed.Load())
	if rc.then == nil {
		progress = max(progress, m.TransactionEndLSN)
	}
	a := &applying{progress: progress, rows: rc, exited: make(chan struct{})}
	l.inflight = a
	go func() {
		defer close(a.exited)
		a.err = l.s.cfg.ApplyStreamed(applyCtx, m.Xid, m.CommitLSN, a.progress)
		a.returned.Store(true)
		l.wake()
	}()
	if rc.then != nil {
		return l.reap(ctx, true)
	}
	return nil
}

// beginReplay starts reading back the messages rc's transaction staged after its rows: the
// transaction begins at its commit's LSN, its ordinals following its rows'.
func (l *loop) beginReplay(rc *rowsCommit) error {
	m := rc.commit
	if _, err := l.asm.handle(&pglogrepl.BeginMessage{FinalLSN: m.CommitLSN, CommitTime: m.CommitTime, Xid: m.Xid}); err != nil {
		return err
	}
	l.asm.seq = l.streaming.open[m.Xid].typed
	l.streaming.replay = rc.then
	return nil
}

// rowsCommitted finishes a streamed transaction whose rows the target merged and committed: its
// staging is dropped, or its messages are read back next.
func (l *loop) rowsCommitted(ctx context.Context, rc *rowsCommit) error {
	if rc.then != nil {
		return l.beginReplay(rc)
	}
	m := rc.commit
	l.asm.committed++
	l.s.transactions.Store(l.asm.committed)
	l.s.streamedCommitted.Add(1)
	t := l.streaming.open[m.Xid]
	l.s.cfg.Logger.Info("streamed transaction committed: its rows, staged ahead, are merged at its commit", "slot", l.s.cfg.Slot,
		"xid", m.Xid, "commit_lsn", m.CommitLSN.String(), "staged_bytes", t.bytes, "merge_seconds", fmt.Sprintf("%.1f", time.Since(rc.began).Seconds()))
	l.closeStreamed(m.Xid)
	return l.streaming.stager.Discard(ctx, m.Xid)
}

// described returns the replicated table Relation message m stands for, found as relation finds
// it, and whether there is one.
func (a *assembler) described(m *pglogrepl.RelationMessage) (changebatch.Table, bool) {
	t, ok := a.byOID[m.RelationID]
	if !ok {
		t, ok = a.tables[changebatch.TableName{Schema: m.Namespace, Name: m.RelationName}.String()]
	}
	return t, ok
}
