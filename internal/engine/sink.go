package engine

import (
	"context"
	"time"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/staging"
)

// streamSink is the stream's member that writes what the streamer hands it (apply, called on the
// streamer's goroutine only): each transaction through the session's applier, with the progress
// at its end LSN under the session's epoch, the audit of replays that had no effect and the
// confirm limit (confirmer). It hands the keys left with unknown values to the filler.
type streamSink struct {
	st        sessionStart
	mon       Monitor
	ap        *apply.Applier
	confirmer *spanConfirmer
	filler    *unknownFiller
	// rows is the staging of streamed transactions' rows (applyStreamed), nil when the daemon
	// does not ask for streamed transactions.
	rows *staging.Table
}

// apply is the stream's ApplyFunc: one target transaction with the batches, the progress
// and, every few seconds, the position up to which the tables' publication membership is
// confirmed (spanConfirmer). It reads no ledger table in full: the gap metric is gapPublisher's.
func (s *streamSink) apply(ctx context.Context, batches []arrow.RecordBatch, end pglogrepl.LSN) error {
	began := time.Now()
	tx, err := s.ap.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// The fences, the progress and the merges of small batches share one round trip.
	results, err := tx.ApplyGroup(ctx, batches, apply.Progress{Slot: s.st.cfg.Slot, LSN: end, Epoch: s.st.epoch})
	if err != nil {
		return err
	}
	rows := map[string]apply.RowCounts{}
	var replays []coverage.SuppressedReplay
	var unknown map[string][][]string // table → keys left with unknown values
	for i, b := range batches {
		res := results[i]
		tab, err := changebatch.TableOf(b.Schema())
		if err != nil {
			return err
		}
		r := rows[tab.String()]
		r.Applied, r.Suppressed = r.Applied+res.Applied, r.Suppressed+res.Suppressed
		rows[tab.String()] = r
		if len(res.Unknown) > 0 {
			if unknown == nil {
				unknown = map[string][][]string{}
			}
			unknown[tab.String()] = append(unknown[tab.String()], res.Unknown...)
		}
		if replays, err = s.noteReplay(replays, tab.TableName, b, res.Suppressed); err != nil {
			return err
		}
	}
	// The audit of what had no effect is written in the transaction it describes (tables with
	// nothing suppressed are left out).
	if err := coverage.RecordSuppressedReplays(ctx, tx.Conn(), replays); err != nil {
		return err
	}
	confirmed, err := s.confirmer.record(ctx, tx.Conn())
	if err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	s.confirmer.committed(confirmed)
	s.filler.note(unknown)
	s.mon.StreamApplied(rows, time.Since(began))
	if len(batches) > 0 {
		s.st.cfg.Logger.Debug("applied", "lsn", end.String(), "applied", tx.Result.Applied,
			"suppressed", tx.Result.Suppressed, "merged", tx.Result.Merged, "truncates", tx.Result.Truncates)
	}
	return nil
}

// noteReplay adds batch b of table t, of whose rows suppressed had no effect, to t's entry of
// replays: its rows offered, rows suppressed and the LSN range of its versions.
func (s *streamSink) noteReplay(replays []coverage.SuppressedReplay, t changebatch.TableName, b arrow.RecordBatch, suppressed int64) ([]coverage.SuppressedReplay, error) {
	v, err := changebatch.NewView(b)
	if err != nil {
		return replays, err
	}
	first, last := v.LSNRange()
	for i := range replays {
		if r := &replays[i]; r.Table == t {
			r.First, r.Last = min(r.First, first), max(r.Last, last)
			r.Offered, r.Suppressed = r.Offered+int64(v.Len()), r.Suppressed+suppressed
			return replays, nil
		}
	}
	return append(replays, coverage.SuppressedReplay{Path: coverage.ReplayStream, Slot: s.st.cfg.Slot, Table: t,
		First: first, Last: last, Offered: int64(v.Len()), Suppressed: suppressed}), nil
}

// applyStreamed is the stream's ApplyStreamedFunc: one target transaction that merges the rows
// streamed transaction xid staged ahead of its commit (staging.Table.StreamedRows) at versions
// (commit, ordinal), with the progress, the audit of rows that had no effect and the confirm
// limit, as apply does for batches.
func (s *streamSink) applyStreamed(ctx context.Context, xid uint32, commit, end pglogrepl.LSN) error {
	began := time.Now()
	staged := s.rows.StreamedRows(xid)
	tx, err := s.ap.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	results, err := tx.ApplyStreamed(ctx, staged, commit, apply.Progress{Slot: s.st.cfg.Slot, LSN: end, Epoch: s.st.epoch})
	if err != nil {
		return err
	}
	rows := map[string]apply.RowCounts{}
	var replays []coverage.SuppressedReplay
	for i, sr := range staged {
		rows[sr.Table.String()] = results[i].Counts()
		if results[i].Suppressed > 0 {
			replays = append(replays, coverage.SuppressedReplay{Path: coverage.ReplayStream, Slot: s.st.cfg.Slot, Table: sr.Table.TableName,
				First: commit, Last: commit, Offered: sr.Rows, Suppressed: results[i].Suppressed})
		}
	}
	if err := coverage.RecordSuppressedReplays(ctx, tx.Conn(), replays); err != nil {
		return err
	}
	confirmed, err := s.confirmer.record(ctx, tx.Conn())
	if err != nil {
		return err
	}
	if k := s.st.cfg.Knobs.BeforeStreamedCommit; k != nil {
		k()
	}
	if err := tx.Commit(ctx); err != nil {
		return err
	}
	s.confirmer.committed(confirmed)
	s.mon.StreamApplied(rows, time.Since(began))
	s.st.cfg.Logger.Debug("applied a streamed transaction's staged rows", "xid", xid, "lsn", end.String(), "applied", tx.Result.Applied,
		"suppressed", tx.Result.Suppressed, "merged", tx.Result.Merged)
	return nil
}
