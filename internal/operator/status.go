package operator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/advisory"
	"github.com/pgconverge/pgconverge/internal/engine"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// StatusConfig configures Status (`pgconverge status`): the coverage report's inputs, whose
// Validate it shares.
type StatusConfig = CoverageConfig

// StatusReport is one view of a deployment for an operator (`pgconverge status`): per table its
// coverage and lag, per slot its health and who holds it, the running backfills and the last
// verify run. Its JSON form is documented in docs/status.md and stays stable: fields are only
// ever added. Times are RFC 3339; ages and durations are seconds (float); sizes are bytes; LSNs
// are strings X/Y.
type StatusReport struct {
	// MadeAt is when the report was made (this machine's clock, UTC).
	MadeAt time.Time `json:"made_at"`
	// SourceLSN and Covered are the coverage report's (coverage.Report).
	SourceLSN coverage.LSN `json:"source_lsn"`
	Covered   bool         `json:"covered"`
	// Tables are in the coverage report's order (by name); Slots by name.
	Tables []TableStatus `json:"tables"`
	Slots  []SlotStatus  `json:"slots"`
	// Waiting are the coverage report's (coverage.Report.Waiting): per slot whose daemon runs, the
	// selected tables it leaves to the running daemon of another slot (followed_by) and waits
	// for, by slot then table; empty when none does.
	Waiting []coverage.Wait `json:"waiting"`
	// Backfills are the runs recorded as running (pgconverge.backfill_runs), oldest first; empty
	// when none runs.
	Backfills []BackfillRunStatus `json:"backfills"`
	// LastVerify is the latest verify run (pgconverge.verify_runs); nil when none was recorded
	// (or the target's schema predates verify).
	LastVerify *VerifyRunStatus `json:"last_verify"`
}

// TableStatus is one table of a StatusReport.
type TableStatus struct {
	Table string `json:"table"`
	// Status is the table's coverage status (TableReport.Status).
	Status coverage.Status `json:"status"`
	// Following is true while a walsender holds the table's slot: a stream follows it now.
	Following bool `json:"following"`
	// Slot is the slot whose stream follows the table; omitted when none does.
	Slot string `json:"slot,omitempty"`
	// WatermarkLSN and LagBytes are the coverage report's: the position up to which the target
	// holds every change, and the WAL between the source's current position and it.
	WatermarkLSN coverage.LSN `json:"watermark_lsn"`
	LagBytes     uint64       `json:"lag_bytes"`
	// LagSeconds is the WriteLagSeconds of the walsender holding the table's slot (see
	// SlotStatus: a recent transaction's delay, stale or nil on an idle source); nil when no
	// walsender holds the slot or PostgreSQL shows no measurement.
	LagSeconds *float64 `json:"lag_seconds"`
	// WatermarkAgeSeconds and GapBytes are the coverage report's: how long ago the stream last
	// recorded the watermark, and the bytes of the table's gaps.
	WatermarkAgeSeconds float64 `json:"watermark_age_seconds"`
	GapBytes            uint64  `json:"gap_bytes"`
	// Note is the coverage report's note; omitted when empty.
	Note string `json:"note,omitempty"`
}

// SlotStatus is one slot: the coverage report's health (coverage.SlotHealth, its fields inline in JSON)
// and the session holding it, from pg_replication_slots.active_pid, pg_stat_activity and
// pg_stat_replication. Every field below is nil when no session holds the slot (the daemon is
// stopped, loading or reconnecting).
type SlotStatus struct {
	coverage.SlotHealth
	// ActivePID is the process id of the session holding the slot on the source.
	ActivePID *int32 `json:"active_pid"`
	// ApplicationName, ClientAddr and BackendStart describe that session (pg_stat_activity);
	// ClientAddr is nil for a Unix-socket connection, and all three are nil when the source role
	// may not see another role's sessions (pg_read_all_stats lets it).
	ApplicationName *string    `json:"application_name"`
	ClientAddr      *string    `json:"client_addr"`
	BackendStart    *time.Time `json:"backend_start"`
	// ConnectedSeconds is how long the session has been connected (the source's now() minus
	// BackendStart).
	ConnectedSeconds *float64 `json:"connected_seconds"`
	// WalsenderState is pg_stat_replication.state (startup, catchup, streaming, stopping).
	WalsenderState *string `json:"walsender_state"`
	// WriteLagSeconds, FlushLagSeconds and ReplayLagSeconds are pg_stat_replication's write_lag,
	// flush_lag and replay_lag: for a recent transaction (PostgreSQL samples at most one a
	// second), the time from its commit on the source until pgconverge reported it received
	// (write: pgconverge reports within 200 ms of the target transaction that holds it, so in
	// steady streaming this is the target's delay), and confirmed to the slot (flush and replay,
	// equal: the slot's confirmation trails the target by up to about 10 s on purpose, docs/operators.md,
	// "The slot's position is honest"). PostgreSQL keeps the last measurement until the client
	// has reported twice that it holds everything sent, so on a source going idle they are
	// stale for some seconds (lag_bytes says there is nothing left), then NULL. Nil when
	// PostgreSQL shows NULL: nothing measured recently, or the source role lacks
	// pg_read_all_stats (WalsenderState is then nil too).
	WriteLagSeconds  *float64 `json:"write_lag_seconds"`
	FlushLagSeconds  *float64 `json:"flush_lag_seconds"`
	ReplayLagSeconds *float64 `json:"replay_lag_seconds"`
	// HolderNote says why the fields above are partly nil when the role cannot see them;
	// omitted otherwise.
	HolderNote string `json:"holder_note,omitempty"`
	// Leader is the daemon that leads the slot on the target (pgconverge.leaders,
	// docs/high-availability.md); nil when no daemon ever led it there.
	Leader *LeaderStatus `json:"leader"`
}

// LeaderStatus is a slot's leading daemon and its standbys, from the target.
type LeaderStatus struct {
	// Holder is the leader's host and process id; Epoch its leader epoch; Since when it took the
	// lead (target clock, as text).
	Holder string `json:"holder"`
	Epoch  int64  `json:"epoch"`
	Since  string `json:"since"`
	// Alive is true while a session holds the slot's leader lock: false after the leader stopped
	// or died and before a standby took over.
	Alive bool `json:"alive"`
	// Standbys counts the daemons waiting to take over.
	Standbys int `json:"standbys"`
}

// BackfillRunStatus is a backfill run recorded as running (pgconverge.backfill_runs).
type BackfillRunStatus struct {
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
	Tables []BackfillTableStatus `json:"tables"`
}

// BackfillTableStatus is one table of a running backfill run.
type BackfillTableStatus struct {
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

// VerifyRunStatus is the latest verify run (pgconverge.verify_runs).
type VerifyRunStatus struct {
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
	SnapshotLSN *coverage.LSN `json:"snapshot_lsn"`
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

// Status is `pgconverge status`: the coverage report (CoverageReport, not computed again) with,
// per slot, the session holding it and its lag (and the tables its daemon waits for), the running backfill runs with their chunks, and
// the latest verify run. Errors are CoverageReport's (no ledger, a wrong source, a failed read)
// and failed reads of the source's or target's views, each naming what it read.
func Status(ctx context.Context, cfg StatusConfig) (StatusReport, error) {
	rep, err := CoverageReport(ctx, cfg)
	if err != nil {
		return StatusReport{}, err
	}
	src, tgt, err := pgsession.ConnectBoth(ctx, cfg.Source, cfg.Target)
	if err != nil {
		return StatusReport{}, err
	}
	defer pgsession.CloseBoth(context.WithoutCancel(ctx), src, tgt)
	out := StatusReport{MadeAt: time.Now().UTC(), SourceLSN: rep.SourceLSN, Covered: rep.Covered,
		Tables: []TableStatus{}, Backfills: []BackfillRunStatus{}, Waiting: rep.Waiting}
	if out.Slots, err = slotStatuses(ctx, src, rep); err != nil {
		return StatusReport{}, err
	}
	leaders, err := apply.ReadLeaders(ctx, tgt)
	if err != nil {
		return StatusReport{}, err
	}
	for i, s := range out.Slots {
		if l, ok := leaders[s.Name]; ok {
			out.Slots[i].Leader = &LeaderStatus{Holder: l.Holder, Epoch: l.Epoch, Since: l.AcquiredAt, Alive: l.Alive, Standbys: l.Standbys}
		}
	}
	bySlot := map[string]SlotStatus{}
	for _, s := range out.Slots {
		bySlot[s.Name] = s
	}
	for _, t := range rep.Tables {
		ts := TableStatus{Table: t.Table, Status: t.Status, Following: t.Following, Slot: t.Slot, WatermarkLSN: t.WatermarkLSN,
			LagBytes: t.LagBytes, WatermarkAgeSeconds: t.WatermarkAgeSeconds, GapBytes: t.GapBytes, Note: t.Note}
		if t.Following {
			ts.LagSeconds = bySlot[t.Slot].WriteLagSeconds
		}
		out.Tables = append(out.Tables, ts)
	}
	if out.Backfills, err = runningBackfills(ctx, tgt); err != nil {
		return StatusReport{}, err
	}
	if out.LastVerify, err = lastVerify(ctx, tgt); err != nil {
		return StatusReport{}, err
	}
	return out, nil
}

// slotStatuses returns the report's slots and those its tables name beyond them, by name, each
// with the session holding it.
func slotStatuses(ctx context.Context, src *pgx.Conn, rep coverage.Report) ([]SlotStatus, error) {
	health := map[string]coverage.SlotHealth{}
	for _, h := range rep.Slots {
		health[h.Name] = h
	}
	for _, t := range rep.Tables {
		if _, ok := health[t.Slot]; t.Slot != "" && !ok {
			h, err := engine.ReadSlotHealth(ctx, src, t.Slot, pglogrepl.LSN(rep.SourceLSN))
			if err != nil {
				return nil, err
			}
			health[t.Slot] = h
		}
	}
	out := make([]SlotStatus, 0, len(health))
	for _, h := range health {
		s := SlotStatus{SlotHealth: h}
		if h.Exists {
			if err := readSlotHolder(ctx, src, &s); err != nil {
				return nil, err
			}
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b SlotStatus) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// readSlotHolder fills in the session holding slot s.Name on src, if any.
func readSlotHolder(ctx context.Context, src *pgx.Conn, s *SlotStatus) error {
	var visible bool
	err := src.QueryRow(ctx, `select s.active_pid, a.application_name, host(a.client_addr), a.backend_start,
  extract(epoch from now() - a.backend_start)::float8, r.state,
  extract(epoch from r.write_lag)::float8, extract(epoch from r.flush_lag)::float8, extract(epoch from r.replay_lag)::float8,
  a.backend_start is not null
from pg_replication_slots s
left join pg_stat_activity a on a.pid = s.active_pid
left join pg_stat_replication r on r.pid = s.active_pid
where s.slot_name = $1 and s.active_pid is not null`, s.Name).Scan(&s.ActivePID, &s.ApplicationName, &s.ClientAddr, &s.BackendStart,
		&s.ConnectedSeconds, &s.WalsenderState, &s.WriteLagSeconds, &s.FlushLagSeconds, &s.ReplayLagSeconds, &visible)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // no session holds it (or it was released meanwhile)
	}
	if err != nil {
		return fmt.Errorf("read the session holding slot %q (pg_replication_slots, pg_stat_activity, pg_stat_replication): %w", s.Name, err)
	}
	switch {
	case !visible:
		s.HolderNote = "the source role may not see the session holding the slot: grant it pg_read_all_stats to see its client, start and lag"
	case s.WalsenderState == nil:
		s.HolderNote = "no walsender state or lag: the session holding the slot is no walsender (a SQL function such as pg_logical_slot_get_changes), or the source role lacks pg_read_all_stats"
	}
	return nil
}

// runningBackfills returns the backfill runs recorded as running, oldest first, with their tables.
func runningBackfills(ctx context.Context, tgt *pgx.Conn) ([]BackfillRunStatus, error) {
	rows, err := tgt.Query(ctx, `select r.id, r.trigger, coalesce(r.slot, ''), r.started_at, extract(epoch from now() - r.started_at)::float8,
  `+advisory.Run("r.id").Held()+`,
  r.workers, r.chunk_rows, r.snapshot_name is not null
from pgconverge.backfill_runs r where r.status = 'running' order by r.id`)
	if err != nil {
		return nil, fmt.Errorf("read the running backfill runs (pgconverge.backfill_runs): %w", err)
	}
	runs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (BackfillRunStatus, error) {
		var r BackfillRunStatus
		err := row.Scan(&r.RunID, &r.Trigger, &r.Slot, &r.StartedAt, &r.RunningSeconds, &r.Alive, &r.Workers, &r.ChunkRows, &r.Joinable)
		r.Tables = []BackfillTableStatus{}
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
func backfillRunTables(ctx context.Context, tgt *pgx.Conn, id int64) ([]BackfillTableStatus, error) {
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
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (BackfillTableStatus, error) {
		var t BackfillTableStatus
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

// lastVerify returns the latest verify run and the discrepancies open now; nil when no run was
// recorded or the target's schema has no verify tables.
func lastVerify(ctx context.Context, tgt *pgx.Conn) (*VerifyRunStatus, error) {
	var exists bool
	if err := tgt.QueryRow(ctx, `select to_regclass('pgconverge.verify_runs') is not null and to_regclass('pgconverge.discrepancies') is not null`).Scan(&exists); err != nil {
		return nil, fmt.Errorf("look up pgconverge.verify_runs: %w", err)
	}
	if !exists {
		return nil, nil
	}
	var v VerifyRunStatus
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
		var l coverage.LSN
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
