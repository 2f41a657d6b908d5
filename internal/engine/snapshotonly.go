package engine

import (
	"context"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/backfillrun"
)

// Tables no publication can carry (changebatch.Table.SnapshotOnly: UNLOGGED, REPLICA IDENTITY
// NOTHING, or without a key and without REPLICA IDENTITY FULL) are kept by backfills alone: each
// reads the whole table at one exact snapshot S and, through the apply step, leaves the target holding it as of S (its fence
// tombstones the rows S does not show). They follow no slot, are never published, and the
// coverage report calls them snapshot-only, as of S. A session loads those that never completed a
// load; --snapshot-schedule backfills them again (schedule.Backfills). One that can be streamed now
// (SET LOGGED, a key or REPLICA IDENTITY FULL added) ends the session (checkStreamable): the next
// one publishes it, and the table, marked for loading as it joins the publication, is loaded from
// a snapshot while the slot keeps its later changes, the seam of any table that joins.

// loadSnapshotOnly backfills the session's snapshot-only tables that never completed a load into
// their current target table, or whose load a schema change voided, before streaming starts.
func (s *session) loadSnapshotOnly(ctx context.Context) error {
	if len(s.snapshotOnly) == 0 {
		return nil
	}
	states, err := coverage.ReadTables(s.bounded(ctx), s.tgt)
	if err != nil {
		return err
	}
	var need []changebatch.Table
	for _, t := range s.snapshotOnly {
		if st := states[t.TableName]; st == nil || st.Backfilled == 0 || st.TargetReplaced {
			need = append(need, t)
		}
	}
	if len(need) == 0 {
		return nil
	}
	job := s.backfillJob(s.mon, need, coverage.TriggerInitial, "snapshot-only load")
	job.Busy, job.AfterChunk, job.Pacer = backfillrun.BusyWait, s.cfg.Knobs.AfterLoadChunk, s.cfg.pace.loadPacer()
	_, err = backfillrun.Run(ctx, job)
	return err
}

// checkStreamable returns an error wrapping errMembershipChanged when a snapshot-only table of the
// session can be streamed now, so that the next session publishes it and loads it at the seam,
// and a *cdc.SchemaChangeError when one's columns changed (the next session describes it again,
// which its next backfill needs). A rewrite is no concern of a table that is read whole each
// time (an UNLOGGED staging table truncated at every batch of its ETL ends nothing). A table it
// cannot describe is left to the next session's start; at is a source position read before on
// src, the source connection it reads on.
func (s sessionStart) checkStreamable(ctx context.Context, src *pgx.Conn, at pglogrepl.LSN) error {
	if len(s.snapshotOnly) == 0 {
		return nil
	}
	if err := s.snapshotOnlyGone(ctx, src); err != nil {
		return err
	}
	columnsOnly := make([]changebatch.Table, len(s.snapshotOnly))
	for i, t := range s.snapshotOnly {
		t.Filenode = 0
		columnsOnly[i] = t
	}
	if changed, err := cdc.ChangedColumns(ctx, src, columnsOnly, at); changed != nil || err != nil {
		if changed != nil {
			return changed
		}
		return err
	}
	for _, t := range s.snapshotOnly {
		now, err := cdc.DescribeTable(ctx, src, t.Schema, t.Name)
		if err != nil || now.SnapshotOnly != "" {
			continue
		}
		return fmt.Errorf("%w: table %s can be streamed now (it was kept by snapshots only: %s): restarting the session to publish it and load it from a snapshot while the slot keeps its later changes",
			errMembershipChanged, t, t.SnapshotOnly)
	}
	return nil
}

// snapshotOnlyGone returns errMembershipChanged when a table the session keeps by snapshots no
// longer names the relation it named at the session's start (dropped, renamed, or dropped and
// created again): its refreshes would fail, and with them those of the other tables of their
// run, until a session selects the tables again. It reads on src.
func (s sessionStart) snapshotOnlyGone(ctx context.Context, src *pgx.Conn) error {
	schemas, names, oids := make([]string, len(s.snapshotOnly)), make([]string, len(s.snapshotOnly)), make([]uint32, len(s.snapshotOnly))
	for i, t := range s.snapshotOnly {
		schemas[i], names[i], oids[i] = t.Schema, t.Name, t.SourceOID
	}
	rows, err := src.Query(ctx, `select k.schema_name, k.table_name from unnest($1::text[], $2::text[], $3::oid[]) k(schema_name, table_name, oid)
where not exists (select 1 from pg_class c join pg_namespace n on n.oid = c.relnamespace where n.nspname = k.schema_name and c.relname = k.table_name and c.oid = k.oid)`,
		schemas, names, oids)
	if err != nil {
		return fmt.Errorf("look up the tables kept by snapshots: %w", err)
	}
	gone, err := pgx.CollectRows(rows, pgx.RowToStructByPos[changebatch.TableName])
	if err != nil {
		return fmt.Errorf("look up the tables kept by snapshots: %w", err)
	}
	if len(gone) > 0 {
		return fmt.Errorf("%w: table %s, kept by snapshots, was dropped, renamed or created again on the source: restarting the session to select the tables again",
			errMembershipChanged, gone[0])
	}
	return nil
}
