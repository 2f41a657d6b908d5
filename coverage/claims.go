package coverage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/advisory"
)

// Claims on chunks (migrations/012_shared_runs.sql): every worker of a backfill run, in the run's
// own process or in a process that joined it from another host (`pgconverge backfill --join`),
// claims a chunk in the ledger before it reads it, so no two workers apply one chunk. A claim is
// taken with SELECT … FOR UPDATE SKIP LOCKED (the queue pattern of PostgreSQL's SELECT
// documentation, "The Locking Clause") and stands while the claimer's target session holds its
// worker lock, so a killed worker's chunks are claimable again at once.

// claimable is the SQL condition under which chunk row c may be claimed by the current session:
// not completed, and not claimed by a session that still holds its worker lock (a claim of the
// current session's own pid is its own, or a dead session's whose pid it reuses).
var claimable = `c.completed_at is null and (c.claimed_by is null or c.claimed_by = pg_backend_pid() or not ` +
	advisory.Worker("c.claimed_by").Held() + `)`

// runAlive is the SQL condition under which backfill run r is running: recorded running, and its
// process's session holds the run's lock (StartRun).
var runAlive = `r.status = 'running' and ` + advisory.Run("r.id").Held()

// HoldWorkerLock takes the worker lock (advisory.Worker of its backend pid) in conn's session: the chunks the session claims stay
// claimed until the session ends.
func HoldWorkerLock(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, `select `+advisory.Worker("pg_backend_pid()").Lock()); err != nil {
		return fmt.Errorf("take the backfill worker lock: %w", err)
	}
	return nil
}

// Claim is what ClaimChunk found.
type Claim struct {
	// Got is true when the calling session now holds the chunk; Before then counts the attempts
	// at it that started earlier.
	Got    bool
	Before int
	// Completed is true when the chunk was completed (by another worker, when Got is false), at
	// snapshot LSN S with Rows rows.
	Completed bool
	S         pglogrepl.LSN
	Rows      int64
}

// ClaimChunk claims chunk ordinal of table backfill id for conn's session, which must hold the
// worker lock (HoldWorkerLock), and counts an attempt at it. When another live worker holds it,
// or it is completed, Got is false. The claim commits without waiting for its WAL flush: a claim a
// crash loses is taken again.
func ClaimChunk(ctx context.Context, conn *pgx.Conn, id int64, ordinal int) (Claim, error) {
	var c Claim
	var before *int
	var s string
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `set local synchronous_commit = off`); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `with c as (
  select c.backfill_id, c.chunk from pgconverge.backfill_chunks c
  where c.backfill_id = $1 and c.chunk = $2 and `+claimable+`
  for update skip locked),
u as (
  update pgconverge.backfill_chunks x set claimed_by = pg_backend_pid(), attempts = x.attempts + 1
  from c where x.backfill_id = c.backfill_id and x.chunk = c.chunk returning x.attempts - 1 as before)
select (select before from u), k.completed_at is not null, coalesce(k.snapshot_lsn::text, ''), coalesce(k.rows, 0)
from pgconverge.backfill_chunks k where k.backfill_id = $1 and k.chunk = $2`, id, ordinal).Scan(&before, &c.Completed, &s, &c.Rows)
	})
	if err != nil {
		return c, fmt.Errorf("claim chunk %d of backfill %d: %w", ordinal, id, err)
	}
	if before != nil {
		c.Got, c.Before, c.Completed = true, *before, false
	}
	if s != "" {
		if c.S, err = pglogrepl.ParseLSN(s); err != nil {
			return c, fmt.Errorf("claim chunk %d of backfill %d: %w", ordinal, id, err)
		}
	}
	return c, nil
}

// SharedRun is a running backfill run that other processes can join.
type SharedRun struct {
	ID      int64
	Trigger string
	// Snapshot is the id of the run's exported snapshot and LSN its S.
	Snapshot string
	LSN      pglogrepl.LSN
	// Publication is the publication the run reads its tables through ("" when it reads them as
	// the ledger records); LeaderSlot and Epoch the daemon's slot and leader epoch ("" and 0 for a
	// run no daemon leads).
	Publication, LeaderSlot string
	Epoch                   int64
	Workers                 int
	ChunkRows               int64
}

// PublishRun records the exported snapshot (name, S) of run id, and the publication its tables
// are read through and the leader slot and epoch its chunks are checked against, so workers of other
// processes can join it (JoinableRun). The caller calls it once the run's tables are set up, when
// every chunk recorded for the run from then on may be read by any worker.
func PublishRun(ctx context.Context, conn *pgx.Conn, id int64, snapshot string, s pglogrepl.LSN, publication, leaderSlot string, epoch int64) error {
	_, err := conn.Exec(ctx, `update pgconverge.backfill_runs set snapshot_name = $2, snapshot_lsn = $3::pg_lsn,
  publication = nullif($4, ''), leader_slot = nullif($5, ''), leader_epoch = nullif($6, 0) where id = $1`,
		id, snapshot, s.String(), publication, leaderSlot, epoch)
	if err != nil {
		return fmt.Errorf("publish backfill run %d: %w", id, err)
	}
	return nil
}

// JoinableRun returns backfill run id, or with id 0 the newest run, when it is running and
// published (PublishRun); nil when there is none.
func JoinableRun(ctx context.Context, conn *pgx.Conn, id int64) (*SharedRun, error) {
	var r SharedRun
	var s string
	err := conn.QueryRow(ctx, `select r.id, r.trigger, r.snapshot_name, r.snapshot_lsn::text, coalesce(r.publication, ''),
  coalesce(r.leader_slot, ''), coalesce(r.leader_epoch, 0), r.workers, r.chunk_rows
from pgconverge.backfill_runs r where ($1 = 0 or r.id = $1) and r.snapshot_name is not null and `+runAlive+`
order by r.id desc limit 1`, id).Scan(&r.ID, &r.Trigger, &r.Snapshot, &s, &r.Publication, &r.LeaderSlot, &r.Epoch, &r.Workers, &r.ChunkRows)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up a running backfill run: %w", err)
	}
	if r.LSN, err = pglogrepl.ParseLSN(s); err != nil {
		return nil, fmt.Errorf("look up a running backfill run: %w", err)
	}
	return &r, nil
}

// RunState returns the recorded status of backfill run id (running, completed, failed or
// interrupted) and whether it is still running (recorded running, and its process holds its lock).
func RunState(ctx context.Context, conn *pgx.Conn, id int64) (status string, running bool, err error) {
	err = conn.QueryRow(ctx, `select r.status, `+runAlive+` from pgconverge.backfill_runs r where r.id = $1`, id).Scan(&status, &running)
	if err != nil {
		return "", false, fmt.Errorf("look up backfill run %d: %w", id, err)
	}
	return status, running, nil
}

// ClaimedChunk is a chunk ClaimAnyChunk claimed.
type ClaimedChunk struct {
	Backfill int64
	Table    changebatch.TableName
	Ordinal  int
	// Lower, Upper and DoneKey are as in ChunkRecord; KeyColumns and Shape are the table
	// backfill's plan columns and source shape (changebatch.Table.Shape).
	Lower, Upper, DoneKey []string
	KeyColumns            []string
	Shape                 string
	// Before counts the attempts at the chunk that started earlier.
	Before int
}

// ClaimAnyChunk claims, for conn's session (which holds the worker lock), the first claimable chunk
// of a running table backfill of run runID, in table backfill and chunk order; nil when there is
// none now (the run's planner may still record more).
func ClaimAnyChunk(ctx context.Context, conn *pgx.Conn, runID int64) (*ClaimedChunk, error) {
	var c ClaimedChunk
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `set local synchronous_commit = off`); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `with c as (
  select c.backfill_id, c.chunk from pgconverge.backfill_chunks c join pgconverge.backfills b on b.id = c.backfill_id
  where b.run_id = $1 and b.status = 'running' and `+claimable+`
  order by c.backfill_id, c.chunk limit 1 for update of c skip locked)
update pgconverge.backfill_chunks x set claimed_by = pg_backend_pid(), attempts = x.attempts + 1
from c, pgconverge.backfills b where x.backfill_id = c.backfill_id and x.chunk = c.chunk and b.id = x.backfill_id
returning x.backfill_id, b.schema_name, b.table_name, x.chunk, x.lower_key, x.upper_key, x.done_key, b.key_columns,
  coalesce(b.source_shape, ''), x.attempts - 1`, runID).Scan(&c.Backfill, &c.Table.Schema, &c.Table.Name, &c.Ordinal,
			&c.Lower, &c.Upper, &c.DoneKey, &c.KeyColumns, &c.Shape, &c.Before)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("claim a chunk of backfill run %d: %w", runID, err)
	}
	return &c, nil
}

// ErrRunEnded says a chunk of a joined run cannot commit: its table's backfill is no longer the
// run's running backfill (the run ended, or a later run adopted it).
var ErrRunEnded = errors.New("the backfill run ended")

// CheckRunOwnsTx checks, in tx, that table backfill id is still running in run runID and locks its
// row FOR SHARE until tx ends, so no later run adopts it (AdoptTableBackfill) before tx commits;
// it returns an error wrapping ErrRunEnded otherwise.
func CheckRunOwnsTx(ctx context.Context, tx pgx.Tx, id, runID int64) error {
	var one int
	err := tx.QueryRow(ctx, `select 1 from pgconverge.backfills where id = $1 and run_id = $2 and status = 'running' for share`, id, runID).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("backfill %d: %w", id, ErrRunEnded)
	}
	if err != nil {
		return fmt.Errorf("check backfill %d is still run %d's: %w", id, runID, err)
	}
	return nil
}

// RunSource returns the source database (cdc.SourceID) the table backfills of run id read, "" when
// none is recorded yet.
func RunSource(ctx context.Context, conn *pgx.Conn, id int64) (string, error) {
	var src string
	err := conn.QueryRow(ctx, `select coalesce(max(source), '') from pgconverge.backfills where run_id = $1`, id).Scan(&src)
	if err != nil {
		return "", fmt.Errorf("read the source of backfill run %d: %w", id, err)
	}
	return src, nil
}

// RegisterWorker records conn's session as one of run runID's process on host (pid and backend
// start of the session), joined when that process joined the run (Join) rather than runs it, seen
// now; Heartbeat keeps it seen.
func RegisterWorker(ctx context.Context, conn *pgx.Conn, runID int64, host string, joined bool) error {
	_, err := conn.Exec(ctx, `insert into pgconverge.backfill_workers (pid, backend_start, run_id, joined, host, seen_at)
select pid, backend_start, $1, $3, $2, clock_timestamp() from pg_stat_activity where pid = pg_backend_pid()
on conflict (pid, backend_start) do update set run_id = excluded.run_id, joined = excluded.joined, host = excluded.host, seen_at = excluded.seen_at`,
		runID, host, joined)
	if err != nil {
		return fmt.Errorf("register the backfill session: %w", err)
	}
	return nil
}

// Heartbeat records that the backfill sessions of the process on host with the backend pids pids
// are alive (a pid another process's session reuses is not its).
func Heartbeat(ctx context.Context, conn *pgx.Conn, host string, pids []int32) error {
	if _, err := conn.Exec(ctx, `update pgconverge.backfill_workers set seen_at = clock_timestamp() where pid = any($1) and host = $2`, pids, host); err != nil {
		return fmt.Errorf("record the backfill sessions alive: %w", err)
	}
	return nil
}

// ForgetWorkers deletes the rows of the backfill sessions with backend pids pids, and of
// sessions that ended.
func ForgetWorkers(ctx context.Context, conn *pgx.Conn, pids []int32) error {
	_, err := conn.Exec(ctx, `delete from pgconverge.backfill_workers w where w.pid = any($1)
  or not exists (select 1 from pg_stat_activity a where a.pid = w.pid and a.backend_start = w.backend_start)`, pids)
	if err != nil {
		return fmt.Errorf("forget the backfill sessions: %w", err)
	}
	return nil
}

// SilentWorker is a backfill session of run RunID's process on Host, or of a process that joined
// it (Joined), last seen Silent seconds before; EndSilentWorkers ended it, or was refused (Refused,
// pg_terminate_backend's insufficient_privilege error).
type SilentWorker struct {
	PID     int32
	RunID   int64
	Joined  bool
	Host    string
	Silent  float64
	Refused error
}

// EndSilentWorkers ends (pg_terminate_backend) the target sessions of backfill processes, of any
// run, whose process was last seen more than lease ago, except those of the process on host self
// (the caller's own, which may just have been paused), and returns them: their claims lapse with
// their sessions, the row locks of their open transactions are released (a later run, or the
// stream, would wait for them otherwise), and a run whose own process froze loses its run lock
// (it no longer shows as running; the next run of its tables resumes it). Only a session that is
// still the one registered (same pid and backend start) is ended; one the role may not signal (a
// superuser's, or another role's without pg_signal_backend) or see (another role's backend start
// without pg_read_all_stats) is returned with Refused set, or left alone.
func EndSilentWorkers(ctx context.Context, conn *pgx.Conn, lease time.Duration, self string) ([]SilentWorker, error) {
	rows, err := conn.Query(ctx, `select w.pid, w.run_id, w.joined, w.host, extract(epoch from clock_timestamp() - w.seen_at)::float8
from pgconverge.backfill_workers w join pg_stat_activity a on a.pid = w.pid and a.backend_start = w.backend_start
where w.seen_at < clock_timestamp() - $1::float8 * interval '1 second' and w.host <> $2`, lease.Seconds(), self)
	if err != nil {
		return nil, fmt.Errorf("find silent backfill sessions: %w", err)
	}
	silent, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SilentWorker, error) {
		var s SilentWorker
		return s, r.Scan(&s.PID, &s.RunID, &s.Joined, &s.Host, &s.Silent)
	})
	if err != nil {
		return nil, fmt.Errorf("find silent backfill sessions: %w", err)
	}
	var out []SilentWorker
	for _, s := range silent {
		// One statement per session: a session the role may not signal fails alone.
		var ended bool
		err := conn.QueryRow(ctx, `select pg_terminate_backend($1)`, s.PID).Scan(&ended)
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == pgerrcode.InsufficientPrivilege:
			s.Refused = pgErr
		case err != nil:
			return out, fmt.Errorf("end silent backfill session %d: %w", s.PID, err)
		case !ended:
			continue // it ended meanwhile
		}
		out = append(out, s)
	}
	return out, nil
}
