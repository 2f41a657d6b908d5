package coverage

import (
	"context"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// TriggerGapRepair is a daemon's repair of tables with a coverage gap by comparison at an exact
// snapshot (run --on-gap=repair): only the keys whose rows differ are written.
const TriggerGapRepair = "gap-repair"

// GapRepair is one table's completed gap repair, as RecordGapRepair records it.
type GapRepair struct {
	RunID int64
	Table changebatch.Table
	// S is the exact snapshot's LSN the source was compared and read at; every key of the table
	// now holds the source's row at S, or a newer version.
	S pglogrepl.LSN
	// Slot is the slot whose stream continues from S or before; Source the source database
	// (cdc.SourceID); KeyColumns the table's key columns.
	Slot, Source string
	KeyColumns   []string
	// Written counts the rows the repair wrote, tombstones included.
	Written int64
}

// RecordGapRepair records, in db (the transaction that raises the table's fence to r.S), that
// r.Table was repaired at r.S: a completed table backfill at S without chunks (the ledger reads it
// as one chunk of every key at S, as a gap backfill's chunks), the table loaded at S and followed
// by r.Slot, as FinishTableBackfill records a backfill. Earlier unfinished backfills of the table
// are marked abandoned: the repair supersedes them. The caller holds the table's backfill lock.
func RecordGapRepair(ctx context.Context, db DB, r GapRepair) error {
	t := r.Table
	_, err := db.Exec(ctx, `with abandoned as (
  update pgconverge.backfills set status = 'abandoned', finished_at = coalesce(finished_at, now())
  where schema_name = $2 and table_name = $3 and status in ('running', 'failed')),
b as (
  insert into pgconverge.backfills (run_id, schema_name, table_name, snapshot_lsn, slot, status, key_columns, target_filenode,
    generation, source, source_shape, rows, finished_at)
  values ($1, $2, $3, $4::pg_lsn, nullif($5, ''), 'completed', $6, pg_relation_filenode($7::regclass),
    coalesce((select generation from pgconverge.tables where schema_name = $2 and table_name = $3), 1), nullif($8, ''), nullif($9, ''),
    $10, now())
  returning schema_name, table_name, slot, snapshot_lsn)
update pgconverge.tables t set loaded_lsn = b.snapshot_lsn, loaded_at = now(), slot = coalesce(b.slot, t.slot)
from b where t.schema_name = b.schema_name and t.table_name = b.table_name`,
		r.RunID, t.Schema, t.Name, r.S.String(), r.Slot, r.KeyColumns, t.Quoted(), r.Source, t.Shape(), r.Written)
	if err != nil {
		return fmt.Errorf("record the gap repair of %s at %s: %w", t, r.S, err)
	}
	return nil
}
