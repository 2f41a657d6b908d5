package coverage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/advisory"
)

// staleVerify is how long a verify run may stay 'running' before TombstoneHorizon stops waiting
// for it: a verify killed mid-run never records its end.
const staleVerify = 24 * time.Hour

// TombstoneHorizon returns, in tx, the version at or below which table t's tombstones may go
// (apply.PruneTombstones) once its fence is raised to it, and false when there is none yet. A
// tombstone guards against an older change of its key arriving late; the fence guards against
// all of them at once, and is safe to raise to a version v when no path can still deliver a
// change at or below v:
//   - the stream: every slot whose stream follows t (an open span of its current generation)
//     has applied past v (pgconverge.progress), and resumes after its progress;
//   - snapshot reads (backfills, verify repairs, reads of unknown values): a new one reads at a
//     snapshot past every position the target holds; a backfill of t now running is excluded by
//     taking t's backfill lock for the transaction (none: false), and a verify run that is
//     running, started less than staleVerify ago, by returning false.
//
// A table kept by snapshots only (no stream) has its fence as H: each refresh raises it to its
// snapshot and holds the backfill lock while it runs.
//
// The least progress H is recorded in pgconverge.tombstone_horizons each call; the version
// returned is (P, 0) for the newest P recorded at least retention ago, so that a tombstone lives
// at least retention after the stream applied it. Stream changes have seq ≥ 1 and snapshot rows
// seq 0, so (P, 0) stops nothing the stream has not applied.
func TombstoneHorizon(ctx context.Context, tx pgx.Tx, t changebatch.TableName, retention time.Duration) (changebatch.Version, bool, error) {
	var locked bool
	if err := tx.QueryRow(ctx, `select `+advisory.Backfill("$1").TryXactLock(), t.String()).Scan(&locked); err != nil {
		return changebatch.Version{}, false, fmt.Errorf("take the backfill lock of %s: %w", t, err)
	}
	if !locked {
		return changebatch.Version{}, false, nil
	}
	var verifying bool
	err := tx.QueryRow(ctx, `select exists (select 1 from pgconverge.verify_runs where status = 'running' and started_at > now() - $1::float8 * interval '1 second')`,
		staleVerify.Seconds()).Scan(&verifying)
	if err != nil {
		return changebatch.Version{}, false, fmt.Errorf("look up running verify runs: %w", err)
	}
	if verifying {
		return changebatch.Version{}, false, nil
	}
	var least *string
	err = tx.QueryRow(ctx, `select min(p.applied_lsn)::text from pgconverge.table_spans s
join pgconverge.stream_segments g on g.id = s.segment_id
join pgconverge.tables t on t.schema_name = s.schema_name and t.table_name = s.table_name and t.generation = s.generation
join pgconverge.progress p on p.slot = g.slot
where s.schema_name = $1 and s.table_name = $2 and s.end_lsn is null`, t.Schema, t.Name).Scan(&least)
	if err != nil {
		return changebatch.Version{}, false, fmt.Errorf("read the progress of the streams that follow %s: %w", t, err)
	}
	if least == nil {
		// No stream follows the table. One kept by snapshots only is written by its refreshes
		// alone, each of which raises the fence to its snapshot: what is at or below the fence
		// guards nothing already.
		err := tx.QueryRow(ctx, `select fence_lsn::text from pgconverge.tables
where schema_name = $1 and table_name = $2 and snapshot_only is not null`, t.Schema, t.Name).Scan(&least)
		if errors.Is(err, pgx.ErrNoRows) {
			return changebatch.Version{}, false, nil
		}
		if err != nil {
			return changebatch.Version{}, false, fmt.Errorf("read the fence of %s: %w", t, err)
		}
	}
	_, err = tx.Exec(ctx, `insert into pgconverge.tombstone_horizons (schema_name, table_name, horizon_lsn) values ($1, $2, $3::pg_lsn)
on conflict do nothing`, t.Schema, t.Name, *least)
	if err != nil {
		return changebatch.Version{}, false, fmt.Errorf("record the tombstone horizon of %s: %w", t, err)
	}
	var horizon *string
	err = tx.QueryRow(ctx, `with old as (
  select recorded_at, horizon_lsn from pgconverge.tombstone_horizons
  where schema_name = $1 and table_name = $2 and recorded_at <= now() - $3::float8 * interval '1 second'
  order by recorded_at desc limit 1),
gone as (
  delete from pgconverge.tombstone_horizons h using old
  where h.schema_name = $1 and h.table_name = $2 and h.recorded_at < old.recorded_at)
select least(horizon_lsn, $4::pg_lsn)::text from old`, t.Schema, t.Name, retention.Seconds(), *least).Scan(&horizon)
	if err == pgx.ErrNoRows {
		return changebatch.Version{}, false, nil
	}
	if err != nil {
		return changebatch.Version{}, false, fmt.Errorf("read the tombstone horizon of %s: %w", t, err)
	}
	lsn, err := pglogrepl.ParseLSN(*horizon)
	if err != nil {
		return changebatch.Version{}, false, err
	}
	return changebatch.Version{LSN: lsn}, true, nil
}
