package coverage

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/advisory"
)

// Ledger rows of backfills (migrations/002_backfill_chunks.sql): a run, each table's backfill in
// it, and each table's chunks with the snapshot LSN S they were read at.

// Run triggers, as stored in pgconverge.backfill_runs.trigger.
const (
	TriggerInitial  = "initial"
	TriggerManual   = "manual"
	TriggerSchedule = "schedule"
	// TriggerGap is a daemon's backfill of tables the coverage ledger shows a gap for (run --on-gap).
	TriggerGap = "gap"
	// TriggerSchemaChange is a daemon's load of tables whose source table changed in a way no
	// streamed change shows (apply.RecordSchemaChange), when no table of the run has a gap.
	TriggerSchemaChange = "schema-change"
)

// StartRun records a running backfill run and returns its id; conn's session holds the run's
// advisory lock (advisory.Run) from then on (until the session ends or releases its locks), which tells other
// processes the run is alive. Runs recorded as running whose lock nobody holds are closed first
// as failed (interrupted), with their table backfills, which a later run may resume. slot is the
// slot whose stream follows the tables ("" when none: a `pgconverge backfill` on its own).
func StartRun(ctx context.Context, conn *pgx.Conn, trigger, slot string, workers, chunkRows int) (int64, error) {
	_, err := conn.Exec(ctx, `with stale as (
  update pgconverge.backfill_runs r set status = 'failed', finished_at = now(),
    error = 'interrupted: the process ended without recording the end of the run'
  where status = 'running' and not `+advisory.Run("r.id").Held()+`
  returning id)
update pgconverge.backfills b set status = 'failed', finished_at = now()
from stale where b.run_id = stale.id and b.status = 'running'`)
	if err != nil {
		return 0, fmt.Errorf("close interrupted backfill runs: %w", err)
	}
	var id int64
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		// The lock is taken before the row becomes visible, so no one sees the run without it.
		return tx.QueryRow(ctx, `with r as (
  insert into pgconverge.backfill_runs (trigger, slot, status, workers, chunk_rows)
  values ($1, nullif($2, ''), 'running', $3, $4) returning id)
select id from r, `+advisory.Run("id").Lock(), trigger, slot, workers, chunkRows).Scan(&id)
	})
	if err != nil {
		return 0, fmt.Errorf("record backfill run: %w", err)
	}
	return id, nil
}

// EndRun records how run id ended: completed when runErr is nil, interrupted when it is (or
// wraps) context.Canceled (a signal or a shutdown stopped it), else failed with runErr's text;
// rows and reread count the rows it read and read again. Table backfills of the run still running
// are marked failed (what they completed stays, for the next run to resume).
func EndRun(ctx context.Context, conn *pgx.Conn, id, rows, reread int64, runErr error) error {
	status, msg := "completed", ""
	switch {
	case errors.Is(runErr, context.Canceled):
		status, msg = "interrupted", "stopped by a signal or a shutdown: the next run of these tables resumes it"
	case runErr != nil:
		status, msg = "failed", runErr.Error()
	}
	_, err := conn.Exec(ctx, `with r as (
  update pgconverge.backfill_runs set status = $2, rows = $3, reread_rows = $4, error = nullif($5, ''), finished_at = now()
  where id = $1 returning id)
update pgconverge.backfills b set status = 'failed', finished_at = now() from r where b.run_id = r.id and b.status = 'running'`,
		id, status, rows, reread, msg)
	if err != nil {
		return fmt.Errorf("record end of backfill run %d: %w", id, err)
	}
	return nil
}

// ChunkRecord is one recorded chunk of a table backfill: the key range (Lower, Upper] as key
// column values in text form (nil bound = unbounded).
type ChunkRecord struct {
	Ordinal      int
	Lower, Upper []string
	// Completed is true once every row of the chunk was applied.
	Completed bool
	// S is the smallest snapshot LSN an applied part of the chunk was read at; zero when nothing
	// of it was applied.
	S pglogrepl.LSN
	// DoneKey is the last key applied of a chunk applied batch by batch and not completed (nil
	// otherwise), DoneRows the rows applied up to it.
	DoneKey  []string
	DoneRows int64
	// Rows is the number of rows of a completed chunk.
	Rows int64
}

// TableBackfill is a table's backfill as the ledger holds it.
type TableBackfill struct {
	ID int64
	// KeyColumns are the columns its plan was cut by (backfill.BlockPlanColumns for a block
	// plan); SourceFile is the source table's file node a block plan was cut from, 0 otherwise.
	KeyColumns []string
	SourceFile uint32
	Chunks     []ChunkRecord
}

// Planned reports whether the chunk plan is complete (its last chunk, unbounded above, exists).
func (b *TableBackfill) Planned() bool {
	return len(b.Chunks) > 0 && b.Chunks[len(b.Chunks)-1].Upper == nil
}

// Resumable returns the latest backfill of t when it was interrupted (not completed, not
// abandoned), was chunked by one of plans (each a list of the columns a plan is cut by), read t through the same row filter and column list
// (Table.Shape) and wrote into the target table's current file (not one since dropped, truncated
// or rewritten), with its chunks in order, or nil when there is none to
// resume. The caller must hold t's backfill
// lock (LockBackfill), so a backfill recorded as running is one whose process died.
func Resumable(ctx context.Context, conn *pgx.Conn, t changebatch.Table, plans ...[]string) (*TableBackfill, error) {
	var id int64
	var status string
	var cols []string
	var sameFile bool
	var sameShape bool
	var sourceFile uint32
	err := conn.QueryRow(ctx, `select id, status, key_columns, target_filenode is not distinct from pg_relation_filenode($3::regclass),
  source_shape is not distinct from nullif($4, ''), coalesce(source_filenode, 0)
from pgconverge.backfills where schema_name = $1 and table_name = $2 order by id desc limit 1`,
		t.Schema, t.Name, t.Quoted(), t.Shape()).Scan(&id, &status, &cols, &sameFile, &sameShape, &sourceFile)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read last backfill of %s: %w", t, err)
	}
	samePlan := slices.ContainsFunc(plans, func(p []string) bool { return slices.Equal(cols, p) })
	if (status != "running" && status != "failed") || !samePlan || !sameFile || !sameShape {
		return nil, nil
	}
	rows, err := conn.Query(ctx, `select chunk, lower_key, upper_key, completed_at is not null, coalesce(snapshot_lsn::text, ''),
  done_key, done_rows, coalesce(rows, 0)
from pgconverge.backfill_chunks where backfill_id = $1 order by chunk`, id)
	if err != nil {
		return nil, fmt.Errorf("read chunks of backfill %d of %s: %w", id, t, err)
	}
	defer rows.Close()
	b := &TableBackfill{ID: id, KeyColumns: cols, SourceFile: sourceFile}
	for rows.Next() {
		var c ChunkRecord
		var s string
		if err := rows.Scan(&c.Ordinal, &c.Lower, &c.Upper, &c.Completed, &s, &c.DoneKey, &c.DoneRows, &c.Rows); err != nil {
			return nil, fmt.Errorf("read chunks of backfill %d of %s: %w", id, t, err)
		}
		if s != "" {
			if c.S, err = pglogrepl.ParseLSN(s); err != nil {
				return nil, fmt.Errorf("read chunks of backfill %d of %s: %w", id, t, err)
			}
		}
		b.Chunks = append(b.Chunks, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read chunks of backfill %d of %s: %w", id, t, err)
	}
	if len(b.Chunks) == 0 {
		return nil, nil
	}
	return b, nil
}

// StartTableBackfill records the running backfill of table t in run runID from snapshot LSN s of
// source database source (cdc.SourceID), chunked by the key columns keyCols, and returns its id. Earlier unfinished backfills of t are
// marked abandoned: the new one supersedes them, and the caller holds t's backfill lock, so none
// of them is still running.
func StartTableBackfill(ctx context.Context, conn *pgx.Conn, runID int64, t changebatch.Table, s pglogrepl.LSN, slot, source string, keyCols []string) (int64, error) {
	var id int64
	err := conn.QueryRow(ctx, `with abandoned as (
  update pgconverge.backfills set status = 'abandoned', finished_at = coalesce(finished_at, now())
  where schema_name = $2 and table_name = $3 and status in ('running', 'failed'))
insert into pgconverge.backfills (run_id, schema_name, table_name, snapshot_lsn, slot, status, key_columns, target_filenode, generation, source, source_shape)
values ($1, $2, $3, $4::pg_lsn, nullif($5, ''), 'running', $6, pg_relation_filenode($7::regclass),
  coalesce((select generation from pgconverge.tables where schema_name = $2 and table_name = $3), 1), nullif($8, ''), nullif($9, '')) returning id`,
		runID, t.Schema, t.Name, s.String(), slot, keyCols, t.Quoted(), source, t.Shape()).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("record backfill of %s at %s: %w", t, s, err)
	}
	return id, nil
}

// RecordSourceFile records, for table backfill id cut by block ranges, the source table's file
// node file its plan was cut from.
func RecordSourceFile(ctx context.Context, conn *pgx.Conn, id int64, file uint32) error {
	if _, err := conn.Exec(ctx, `update pgconverge.backfills set source_filenode = $2 where id = $1`, id, file); err != nil {
		return fmt.Errorf("record the source file of backfill %d: %w", id, err)
	}
	return nil
}

// AdoptTableBackfill moves the interrupted table backfill id into run runID, whose stream slot is
// slot, and marks it running again. Its previous run, when still recorded as running, is marked
// failed: the caller holds the table's backfill lock, which that run's process would hold.
func AdoptTableBackfill(ctx context.Context, conn *pgx.Conn, id, runID int64, slot string) error {
	_, err := conn.Exec(ctx, `with old as (
  update pgconverge.backfill_runs r set status = 'failed', finished_at = now(),
    error = 'interrupted: the process ended without recording the end of the run'
  from pgconverge.backfills b where b.id = $1 and r.id = b.run_id and r.status = 'running')
update pgconverge.backfills set run_id = $2, slot = nullif($3, ''), status = 'running', finished_at = null
where id = $1`, id, runID, slot)
	if err != nil {
		return fmt.Errorf("resume backfill %d: %w", id, err)
	}
	return nil
}

// RecordChunk records chunk ordinal of table backfill id with key range (lower, upper].
func RecordChunk(ctx context.Context, conn *pgx.Conn, id int64, ordinal int, lower, upper []string) error {
	_, err := conn.Exec(ctx, `insert into pgconverge.backfill_chunks (backfill_id, chunk, lower_key, upper_key) values ($1, $2, $3, $4)`,
		id, ordinal, lower, upper)
	if err != nil {
		return fmt.Errorf("record chunk %d of backfill %d: %w", ordinal, id, err)
	}
	return nil
}

// ChunkProgress records, in tx (the transaction that applied them), that the rows of chunk
// ordinal of table backfill id up to key doneKey were applied from snapshot LSN s: rows more
// rows, and completed when the whole chunk is in. A chunk applied in one transaction calls it
// once with completed set.
func ChunkProgress(ctx context.Context, tx pgx.Tx, id int64, ordinal int, s pglogrepl.LSN, doneKey []string, rows int64, completed bool) error {
	_, err := tx.Exec(ctx, `update pgconverge.backfill_chunks set
  snapshot_lsn = least(snapshot_lsn, $3::pg_lsn), done_rows = done_rows + $5,
  done_key = case when $6 then null else $4::text[] end,
  rows = case when $6 then done_rows + $5 end,
  completed_at = case when $6 then now() end
where backfill_id = $1 and chunk = $2`, id, ordinal, s.String(), doneKey, rows, completed)
	if err != nil {
		return fmt.Errorf("record progress of chunk %d of backfill %d: %w", ordinal, id, err)
	}
	return nil
}

// ResetChunk forgets what was applied of chunk ordinal of table backfill id, which is then read
// again whole: its earlier snapshot is older than what the stream covers.
func ResetChunk(ctx context.Context, conn *pgx.Conn, id int64, ordinal int) error {
	_, err := conn.Exec(ctx, `update pgconverge.backfill_chunks set snapshot_lsn = null, done_key = null, done_rows = 0,
  rows = null, completed_at = null where backfill_id = $1 and chunk = $2`, id, ordinal)
	if err != nil {
		return fmt.Errorf("reset chunk %d of backfill %d: %w", ordinal, id, err)
	}
	return nil
}

// FinishTableBackfill marks table backfill id completed, in tx, once every chunk completed, and
// returns the smallest S of its chunks: the table now counts as backfilled at that S
// (pgconverge.tables.loaded_lsn), followed by the backfill's slot or, when it has none, by the
// slot that followed the table before.
func FinishTableBackfill(ctx context.Context, tx pgx.Tx, id int64) (pglogrepl.LSN, error) {
	var s string
	err := tx.QueryRow(ctx, `with c as (
  select min(snapshot_lsn) as s, sum(rows) as rows, count(*) filter (where completed_at is null) as open
  from pgconverge.backfill_chunks where backfill_id = $1),
b as (
  update pgconverge.backfills b set status = 'completed', rows = c.rows, finished_at = now()
  from c where b.id = $1 and c.open = 0 and c.s is not null
  returning b.schema_name, b.table_name, b.slot, c.s)
update pgconverge.tables t set loaded_lsn = b.s, loaded_at = now(), slot = coalesce(b.slot, t.slot)
from b where t.schema_name = b.schema_name and t.table_name = b.table_name
returning b.s::text`, id).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("complete backfill %d: a chunk is not completed, or its table is not registered", id)
	}
	if err != nil {
		return 0, fmt.Errorf("complete backfill %d: %w", id, err)
	}
	return pglogrepl.ParseLSN(s)
}

// LockBackfill takes table t's backfill lock (advisory.Backfill) in conn's session, which holds it until
// UnlockBackfill or until the session ends (a crashed process releases it). With wait it waits
// for the lock (until ctx ends), else it returns false at once when another session holds it.
func LockBackfill(ctx context.Context, conn *pgx.Conn, t changebatch.TableName, wait bool) (bool, error) {
	q := `select ` + advisory.Backfill("$1").TryLock()
	if wait {
		q = `select true from ` + advisory.Backfill("$1").Lock()
	}
	var ok bool
	if err := conn.QueryRow(ctx, q, t.String()).Scan(&ok); err != nil {
		return false, fmt.Errorf("take the backfill lock of %s: %w", t, err)
	}
	return ok, nil
}

// AbandonRun marks the unfinished table backfills of run id abandoned: what they completed is not
// to be resumed (the source table was rewritten or truncated under them).
func AbandonRun(ctx context.Context, conn *pgx.Conn, id int64) error {
	_, err := conn.Exec(ctx, `update pgconverge.backfills set status = 'abandoned', finished_at = coalesce(finished_at, now())
where run_id = $1 and status in ('running', 'failed')`, id)
	if err != nil {
		return fmt.Errorf("abandon the backfills of run %d: %w", id, err)
	}
	return nil
}

// BackfillHeld reports whether some session holds table t's backfill lock: a backfill of t is
// running now.
func BackfillHeld(ctx context.Context, conn *pgx.Conn, t changebatch.TableName) (bool, error) {
	var held bool
	err := conn.QueryRow(ctx, `select `+advisory.Backfill("$1").Held(), t.String()).Scan(&held)
	if err != nil {
		return false, fmt.Errorf("look up the backfill lock of %s: %w", t, err)
	}
	return held, nil
}

// UnlockBackfill releases table t's backfill lock held by conn's session.
func UnlockBackfill(ctx context.Context, conn *pgx.Conn, t changebatch.TableName) error {
	if _, err := conn.Exec(ctx, `select `+advisory.Backfill("$1").Unlock(), t.String()); err != nil {
		return fmt.Errorf("release the backfill lock of %s: %w", t, err)
	}
	return nil
}

// Unwritten reports whether table t's target table holds no row at all (not even a tombstone) and
// no slot's stream follows it (pgconverge.tables.slot is NULL). With t's backfill lock held, no
// stream can start writing it either (a daemon loads a table, under that lock, before it streams
// it), so at the end of the backfill every row it holds was written by the backfill.
func Unwritten(ctx context.Context, conn *pgx.Conn, t changebatch.TableName) (bool, error) {
	var ok bool
	err := conn.QueryRow(ctx, `select not exists (select 1 from `+t.Quoted()+`)
  and not exists (select 1 from pgconverge.tables where schema_name = $1 and table_name = $2 and slot is not null)`,
		t.Schema, t.Name).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("check whether target table %s is empty: %w", t, err)
	}
	return ok, nil
}

// AbandonBackfills marks the unfinished backfills of table t abandoned: the stream
// stopped covering the table (it left the selection or the publication) or its target table was
// created anew, so what they completed may be stale and is never resumed.
func AbandonBackfills(ctx context.Context, conn *pgx.Conn, t changebatch.TableName) error {
	_, err := conn.Exec(ctx, `update pgconverge.backfills set status = 'abandoned', finished_at = coalesce(finished_at, now())
where schema_name = $1 and table_name = $2 and status in ('running', 'failed')`, t.Schema, t.Name)
	if err != nil {
		return fmt.Errorf("abandon unfinished backfills of %s: %w", t, err)
	}
	return nil
}

// FollowingSlot returns the slot whose stream follows table t since its last completed backfill
// (pgconverge.tables.slot), or "" when none does.
func FollowingSlot(ctx context.Context, conn *pgx.Conn, t changebatch.TableName) (string, error) {
	var slot string
	err := conn.QueryRow(ctx, `select coalesce(slot, '') from pgconverge.tables where schema_name = $1 and table_name = $2`,
		t.Schema, t.Name).Scan(&slot)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("read the slot following %s: %w", t, err)
	}
	return slot, nil
}

// LastChunk returns the last recorded chunk of table backfill id (its ordinal and upper key), with
// Ordinal -1 when none is recorded.
func LastChunk(ctx context.Context, conn *pgx.Conn, id int64) (ChunkRecord, error) {
	var c ChunkRecord
	err := conn.QueryRow(ctx, `select chunk, upper_key from pgconverge.backfill_chunks where backfill_id = $1 order by chunk desc limit 1`, id).
		Scan(&c.Ordinal, &c.Upper)
	if errors.Is(err, pgx.ErrNoRows) {
		return ChunkRecord{Ordinal: -1}, nil
	}
	if err != nil {
		return c, fmt.Errorf("read the last chunk of backfill %d: %w", id, err)
	}
	return c, nil
}
