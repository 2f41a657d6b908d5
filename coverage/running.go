package coverage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/advisory"
)

// What status shows of the ledger's running backfill runs and its latest verify run.

// RunningBackfill is a backfill run recorded as running (pgconverge.backfill_runs).
type RunningBackfill struct {
	RunID int64 `json:"run_id"`
	// Trigger is initial, manual, schedule, gap or schema-change.
	Trigger string `json:"trigger"`
	// Slot is the slot whose stream follows the run's tables; omitted for a `pgconverge backfill`
	// run without one.
	Slot string `json:"slot,omitempty"`
	// StartedAt is when the run started; RunningSeconds how long ago that was (target clock).
	StartedAt      time.Time `json:"started_at"`
	RunningSeconds float64   `json:"running_seconds"`
	// Alive is true while the run's process holds the run's advisory lock on the target; false
	// for a run whose process died without recording its end (kill -9): the next backfill run
	// closes it as failed and resumes its tables.
	Alive bool `json:"alive"`
	// Workers and ChunkRows are the run's --workers and --chunk-rows.
	Workers   int   `json:"workers"`
	ChunkRows int64 `json:"chunk_rows"`
	// Joinable is true once the run published its snapshot: `backfill --join` can add workers.
	Joinable bool `json:"joinable"`
	// Tables are the run's table backfills (pgconverge.backfills), by name; empty until the run
	// took its snapshot.
	Tables []RunningTable `json:"tables"`
}

// RunningTable is one table of a running backfill run.
type RunningTable struct {
	Table string `json:"table"`
	// Status is the table's backfill status: running, completed (the run goes on with other
	// tables) or failed.
	Status string `json:"status"`
	// StartedAt is when the table's backfill started (a resumed backfill keeps its first start).
	StartedAt time.Time `json:"started_at"`
	// ChunksDone counts completed chunks, ChunksPlanned the chunks planned so far;
	// PlanningComplete is true once the last chunk is planned (ChunksPlanned is then the total).
	ChunksDone    int `json:"chunks_done"`
	ChunksPlanned int `json:"chunks_planned"`
	// ChunksApplying counts the chunks workers are applying now (claimed by a live session, of
	// the run's process or of one that joined it).
	ChunksApplying   int  `json:"chunks_applying"`
	PlanningComplete bool `json:"planning_complete"`
	// Rows are the rows applied so far: completed chunks' rows plus the applied part of chunks
	// merged batch by batch (kept chunks of an interrupted run included).
	Rows int64 `json:"rows"`
}

// LastVerify is the latest verify run (pgconverge.verify_runs).
type LastVerify struct {
	RunID int64 `json:"run_id"`
	// Trigger is manual or schedule; Status running, completed or failed (Error says why).
	Trigger string `json:"trigger"`
	Status  string `json:"status"`
	// StartedAt and FinishedAt (nil while running); AgeSeconds is how long ago it started
	// (target clock).
	StartedAt  time.Time  `json:"started_at"`
	FinishedAt *time.Time `json:"finished_at"`
	AgeSeconds float64    `json:"age_seconds"`
	// SnapshotLSN is the exact snapshot S it compared at; nil before it took one.
	SnapshotLSN *LSN `json:"snapshot_lsn"`
	// Tables, Found, Repaired and Open are the run's counts: tables compared, discrepancies
	// found, repaired, and left open when it ended.
	Tables   int   `json:"tables"`
	Found    int64 `json:"found"`
	Repaired int64 `json:"repaired"`
	Open     int64 `json:"open"`
	// OpenNow counts the discrepancies open now, over every table (later runs, repairs and
	// daemons may have closed or found some since).
	OpenNow int64 `json:"open_now"`
	// Error is a failed run's error; omitted otherwise.
	Error string `json:"error,omitempty"`
}

// RunningBackfills returns the backfill runs recorded as running, oldest first, with their tables.
func RunningBackfills(ctx context.Context, tgt DB) ([]RunningBackfill, error) {
	rows, err := tgt.Query(ctx, `select r.id, r.trigger, coalesce(r.slot, ''), r.started_at, extract(epoch from now() - r.started_at)::float8,
  `+advisory.Run("r.id").Held()+`,
  r.workers, r.chunk_rows, r.snapshot_name is not null
from pgconverge.backfill_runs r where r.status = 'running' order by r.id`)
	if err != nil {
		return nil, fmt.Errorf("read the running backfill runs (pgconverge.backfill_runs): %w", err)
	}
	runs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (RunningBackfill, error) {
		var r RunningBackfill
		err := row.Scan(&r.RunID, &r.Trigger, &r.Slot, &r.StartedAt, &r.RunningSeconds, &r.Alive, &r.Workers, &r.ChunkRows, &r.Joinable)
		r.Tables = []RunningTable{}
		return r, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the running backfill runs (pgconverge.backfill_runs): %w", err)
	}
	for i := range runs {
		if runs[i].Tables, err = backfillRunTables(ctx, tgt, runs[i].RunID); err != nil {
			return nil, err
		}
	}
	return runs, nil
}

// backfillRunTables returns the table backfills of run id with their chunks' progress, by name.
func backfillRunTables(ctx context.Context, tgt DB, id int64) ([]RunningTable, error) {
	rows, err := tgt.Query(ctx, `select b.schema_name, b.table_name, b.status, b.started_at,
  count(c.chunk) filter (where c.completed_at is not null)::int, count(c.chunk)::int,
  count(c.chunk) filter (where c.completed_at is null and `+advisory.Worker("c.claimed_by").Held()+`)::int,
  coalesce(bool_or(c.chunk is not null and c.upper_key is null), false),
  coalesce(sum(case when c.completed_at is not null then coalesce(c.rows, 0) else c.done_rows end), 0)::bigint
from pgconverge.backfills b left join pgconverge.backfill_chunks c on c.backfill_id = b.id
where b.run_id = $1
group by b.id order by b.schema_name, b.table_name`, id)
	if err != nil {
		return nil, fmt.Errorf("read the tables of backfill run %d (pgconverge.backfills, backfill_chunks): %w", id, err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (RunningTable, error) {
		var t RunningTable
		var schema, name string
		err := row.Scan(&schema, &name, &t.Status, &t.StartedAt, &t.ChunksDone, &t.ChunksPlanned, &t.ChunksApplying, &t.PlanningComplete, &t.Rows)
		t.Table = changebatch.TableName{Schema: schema, Name: name}.String()
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the tables of backfill run %d (pgconverge.backfills, backfill_chunks): %w", id, err)
	}
	return out, nil
}

// ReadLastVerify returns the latest verify run and the discrepancies open now; nil when no run was
// recorded or the target's schema has no verify tables.
func ReadLastVerify(ctx context.Context, tgt DB) (*LastVerify, error) {
	var exists bool
	if err := tgt.QueryRow(ctx, `select to_regclass('pgconverge.verify_runs') is not null and to_regclass('pgconverge.discrepancies') is not null`).Scan(&exists); err != nil {
		return nil, fmt.Errorf("look up pgconverge.verify_runs: %w", err)
	}
	if !exists {
		return nil, nil
	}
	var v LastVerify
	var snap, msg *string
	err := tgt.QueryRow(ctx, `select id, trigger, status, started_at, finished_at, extract(epoch from now() - started_at)::float8,
  snapshot_lsn::text, tables, found, repaired, open, error,
  (select count(*) from pgconverge.discrepancies where remediated_at is null)
from pgconverge.verify_runs order by id desc limit 1`).Scan(&v.RunID, &v.Trigger, &v.Status, &v.StartedAt, &v.FinishedAt, &v.AgeSeconds,
		&snap, &v.Tables, &v.Found, &v.Repaired, &v.Open, &msg, &v.OpenNow)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the last verify run (pgconverge.verify_runs): %w", err)
	}
	if snap != nil {
		var l LSN
		if err := l.UnmarshalText([]byte(*snap)); err != nil {
			return nil, fmt.Errorf("read the last verify run (pgconverge.verify_runs): snapshot_lsn %q: %w", *snap, err)
		}
		v.SnapshotLSN = &l
	}
	if msg != nil {
		v.Error = *msg
	}
	return &v, nil
}
