package backfillrun

import (
	"context"
	"slices"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/backfill"
	"github.com/pgconverge/pgconverge/coverage"
)

// This file prepares the chunks of a backfill run: resuming an interrupted backfill of a table,
// or planning it anew.

// startTable records table t in run runID, adopting its interrupted backfill when job.Resume, and
// returns its state, the recorded chunks still to read, and the rows of the chunks it keeps. src
// is a source connection.
//
// A table left without its primary key by an interrupted bulk load gets it back first. An
// interrupted load cut by blocks that cannot be resumed (blockPlanNotResumable) is started over:
// the table, when it holds only that load's rows (apply.EmptyInterruptedBulkLoad), is emptied
// and bulk loaded again. A new backfill of a table that holds
// no row and that no stream follows is a bulk load: its key is dropped until it completes
// (apply.DeferKey), and it is cut by block ranges where the source allows it
// (backfill.BlockPlanOK). In a daemon's run ctrl holds the daemon's epoch meanwhile (runTables).
func startTable(ctx context.Context, ctrl, src *pgx.Conn, job Job, runID int64, s pglogrepl.LSN, t changebatch.Table) (*tableRun, []chunkWork, int64, error) {
	keys := backfill.KeyColumnNames(t)
	tr := &tableRun{t: t}
	var prev *coverage.TableBackfill
	if job.Resume {
		var err error
		if prev, err = coverage.Resumable(ctx, ctrl, t, keys, backfill.BlockPlanColumns()); err != nil {
			return nil, nil, 0, err
		}
	}
	if prev != nil && slices.Equal(prev.KeyColumns, backfill.BlockPlanColumns()) {
		why, err := blockPlanNotResumable(ctx, src, job, prev, t)
		if err != nil {
			return nil, nil, 0, err
		}
		tr.byBlock = why == ""
		if why != "" {
			var loadedAt []pglogrepl.LSN
			for _, c := range prev.Chunks {
				if c.S != 0 {
					loadedAt = append(loadedAt, c.S)
				}
			}
			emptied, err := apply.EmptyInterruptedBulkLoad(ctx, ctrl, t, loadedAt)
			if err != nil {
				return nil, nil, 0, err
			}
			job.Logger.Info("not resuming the interrupted bulk load: "+why+"; the table is read again whole", "table", t.String(),
				"backfill", prev.ID, "emptied_target_table", emptied)
			prev = nil
		}
	}
	if err := restoreKey(ctx, ctrl, t, job); err != nil {
		return nil, nil, 0, err
	}
	if prev == nil {
		unwritten, err := coverage.Unwritten(ctx, ctrl, t.TableName)
		if err != nil {
			return nil, nil, 0, err
		}
		bulk := unwritten && !t.Keyless
		tr.unwritten, tr.byBlock = unwritten, bulk && backfill.BlockPlanOK(src, t)
		plan := keys
		if tr.byBlock {
			plan = backfill.BlockPlanColumns()
		}
		if tr.id, err = coverage.StartTableBackfill(ctx, ctrl, runID, t, s, job.Slot, job.SourceID, plan); err != nil || !bulk {
			return tr, nil, 0, err
		}
		tr.keyDeferred = true
		if job.BeforeFenced != nil {
			job.BeforeFenced("key " + t.String())
		}
		return tr, nil, 0, apply.DeferKey(ctx, ctrl, t, changebatch.Version{LSN: s})
	}
	if err := coverage.AdoptTableBackfill(ctx, ctrl, prev.ID, runID, job.Slot); err != nil {
		return nil, nil, 0, err
	}
	tr.id, tr.planned, tr.adopted = prev.ID, prev.Planned(), true
	var work []chunkWork
	var kept int64
	done := 0
	for _, c := range prev.Chunks {
		keep := c.S != 0 && c.S >= job.KeepFrom // the stream covers what changed since
		if c.Completed && keep {
			kept += c.Rows
			tr.rows += c.Rows
			done++
			continue
		}
		cw := chunkWork{tr: tr, ordinal: c.Ordinal, chunk: backfill.Chunk{Lower: c.Lower, Upper: c.Upper, ByBlock: tr.byBlock}}
		switch {
		case c.DoneKey != nil && keep:
			cw.doneKey = c.DoneKey
			kept += c.DoneRows
			tr.rows += c.DoneRows
		case c.S != 0:
			if err := coverage.ResetChunk(ctx, ctrl, prev.ID, c.Ordinal); err != nil {
				return nil, nil, 0, err
			}
		}
		work = append(work, cw)
	}
	tr.open = len(work)
	job.Logger.Info("resuming an interrupted backfill", "table", t.String(), "backfill", prev.ID,
		"chunks_kept", done, "chunks_to_read", len(work), "plan_complete", tr.planned, "rows_kept", kept)
	following := job.Slot
	if following == "" {
		var err error
		if following, err = coverage.FollowingSlot(ctx, ctrl, t.TableName); err != nil {
			return nil, nil, 0, err
		}
	}
	if kept > 0 && following == "" {
		job.Logger.Warn("kept chunks hold the table as of their own, older snapshot: later changes reach them only through a stream (pgconverge run on this table); without one, --resume=false reads the whole table at one point in time",
			"table", t.String())
	}
	return tr, work, kept, nil
}

// blockPlanNotResumable says why the interrupted block plan prev of table t cannot be resumed,
// "" when it can: its chunks hold the rows stored in their blocks at their snapshots, and a row
// stored outside them then may have moved into them since (an update's new version, an insert
// into space a VACUUM freed), which only a stream from before those snapshots brings; and a
// rewrite of the source table moved every row without a change to stream. src is a source
// connection.
func blockPlanNotResumable(ctx context.Context, src *pgx.Conn, job Job, prev *coverage.TableBackfill, t changebatch.Table) (string, error) {
	file, err := backfill.SourceFile(ctx, src, t)
	switch {
	case err != nil:
		return "", err
	case file != prev.SourceFile:
		return "the source table was rewritten since its plan cut its blocks (VACUUM FULL, CLUSTER, TRUNCATE or a rewriting ALTER TABLE), so its rows moved", nil
	case job.Slot == "":
		return "no stream follows the table to bring the rows that moved into the blocks already copied since (an update's new version, an insert into freed space)", nil
	}
	return "", nil
}

// planTable hands tr's adopted chunks to the workers, then plans and records the rest of the table
// (all of it for a new backfill) in snap and hands those over as they are planned.
// src is a source connection for the planner's snapshot transaction.
func planTable(ctx context.Context, ctrl, src *pgx.Conn, job Job, snap backfill.Snapshot, tr *tableRun, adopted []chunkWork, work chan<- chunkWork) error {
	send := func(cw chunkWork) error {
		select {
		case work <- cw:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for _, cw := range adopted {
		if err := send(cw); err != nil {
			return err
		}
	}
	if tr.planned {
		return nil
	}
	var after []string
	next := 0
	if tr.adopted {
		last, err := coverage.LastChunk(ctx, ctrl, tr.id)
		if err != nil {
			return err
		}
		after, next = last.Upper, last.Ordinal+1
	}
	var p *backfill.Planner
	var err error
	if tr.byBlock {
		if p, err = backfill.NewBlockPlanner(ctx, src, snap, tr.t, job.ChunkRows, after); err != nil {
			return err
		}
		if err := coverage.RecordSourceFile(ctx, ctrl, tr.id, p.SourceFile()); err != nil {
			return err
		}
	} else if p, err = backfill.NewPlanner(src, snap, tr.t, job.ChunkRows, after); err != nil {
		return err
	}
	for ; ; next++ {
		c, ok, err := p.Next(ctx)
		if err != nil || !ok {
			return err
		}
		if err := coverage.RecordChunk(ctx, ctrl, tr.id, next, c.Lower, c.Upper); err != nil {
			return err
		}
		tr.mu.Lock()
		tr.open++
		tr.planned = c.Upper == nil
		tr.mu.Unlock()
		if err := send(chunkWork{tr: tr, ordinal: next, chunk: c}); err != nil {
			return err
		}
	}
}

// estimateRows returns the planner's row estimate of t (pg_class.reltuples; for a partitioned
// table the sum of its partitions' known estimates) over the source connection src, for
// progress; 0 when unknown.
func estimateRows(ctx context.Context, src *pgx.Conn, t changebatch.Table) int64 {
	var n float64
	err := src.QueryRow(ctx, `with recursive tree (oid) as (
  select $1::regclass::oid union all select i.inhrelid from pg_inherits i join tree on i.inhparent = tree.oid
  where (select relkind from pg_class where oid = $1::regclass) = 'p')
select coalesce(sum(c.reltuples) filter (where c.reltuples >= 0), -1) from tree join pg_class c on c.oid = tree.oid
where c.relkind <> 'p'`, t.Quoted()).Scan(&n)
	if err != nil || n < 0 {
		return 0
	}
	return int64(n)
}

// restoreKey builds target table t's primary key when an interrupted bulk load left it without
// one (apply.RestoreKey), and logs it.
func restoreKey(ctx context.Context, ctrl *pgx.Conn, t changebatch.Table, job Job) error {
	var built bool
	err := pgx.BeginFunc(ctx, ctrl, func(tx pgx.Tx) error {
		var err error
		built, err = apply.RestoreKey(ctx, tx, t)
		return err
	})
	if built {
		job.Logger.Info("built the primary key an interrupted bulk load of the table had deferred", "table", t.String())
	}
	return err
}
