package operator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgerrcode"

	"github.com/pgconverge/pgconverge/internal/control"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/engine"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/internal/staging"
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
	Backfills []coverage.RunningBackfill `json:"backfills"`
	// LastVerify is the latest verify run (pgconverge.verify_runs); nil when none was recorded
	// (or the target's schema predates verify).
	LastVerify *coverage.LastVerify `json:"last_verify"`
	// SlotCreations are the replication slots being created on the source that wait for
	// transactions open there (a daemon's slot, or a backfill's or verify's snapshot slot);
	// empty when none waits.
	SlotCreations []SlotCreation `json:"slot_creations"`
}

// SlotCreation is a slot's creation that waits (pgsession.SlotWait): the creating walsender, its
// command, how long it has run (seconds), and the backends it waits for.
type SlotCreation struct {
	WalsenderPID   int32               `json:"walsender_pid"`
	Command        string              `json:"command"`
	WaitingSeconds float64             `json:"waiting_seconds"`
	Blockers       []pgsession.Blocker `json:"blockers"`
}

// slotCreations returns the slot creations on src that wait for other backends.
func slotCreations(ctx context.Context, src *pgx.Conn) ([]SlotCreation, error) {
	rows, err := src.Query(ctx, `select pid, query, extract(epoch from now() - query_start)::float8 from pg_stat_activity
where backend_type = 'walsender' and query ilike 'CREATE_REPLICATION_SLOT%' and cardinality(pg_blocking_pids(pid)) > 0 order by pid`)
	if err != nil {
		return nil, fmt.Errorf("read the slot creations on the source: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SlotCreation, error) {
		var c SlotCreation
		err := r.Scan(&c.WalsenderPID, &c.Command, &c.WaitingSeconds)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the slot creations on the source: %w", err)
	}
	if out == nil {
		out = []SlotCreation{}
	}
	for i := range out {
		if out[i].Blockers, err = pgsession.BlockersOf(ctx, src, uint32(out[i].WalsenderPID)); err != nil {
			return nil, fmt.Errorf("read what a slot creation waits for: %w", err)
		}
	}
	return out, nil
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
	// Streaming is the slot's streaming of transactions before their commit
	// (--stream-in-progress); nil when the source keeps no statistics of the slot (before
	// PostgreSQL 14, or the slot is missing).
	Streaming *StreamingStatus `json:"streaming,omitempty"`
	// Controls are the operator's controls of the slot's daemon in the target's ledger: what is
	// paused, since when and by whom (pgconverge pause), and the rate limits of its backfills and
	// verifies (rate_limits omitted when none were recorded). The WAL the slot holds meanwhile is
	// restart_lag_bytes above.
	Controls control.State `json:"controls"`
}

// StreamingStatus is what the source counted of a slot's decoding (pg_stat_replication_slots,
// PostgreSQL 14 and later, since its statistics were last reset) and what the target stages of
// the transactions the source streams before their commit (pgconverge.stream_staging).
type StreamingStatus struct {
	// SpillBytes is how many bytes of decoded transactions the source wrote to its disk because
	// they passed logical_decoding_work_mem (0 while streaming takes them); StreamBytes how many
	// it streamed before their commit; SpillTransactions and StreamTransactions count them.
	SpillBytes         int64 `json:"spill_bytes"`
	SpillTransactions  int64 `json:"spill_transactions"`
	StreamBytes        int64 `json:"stream_bytes"`
	StreamTransactions int64 `json:"stream_transactions"`
	// OpenTransactions, StagedMessages and StagedBytes are the streamed transactions not
	// committed or aborted yet and what they staged on the target.
	OpenTransactions int64 `json:"open_transactions"`
	StagedMessages   int64 `json:"staged_messages"`
	StagedBytes      int64 `json:"staged_bytes"`
	// StagedRowTables and StagedRowBytes are the row staging tables of those transactions (one
	// per transaction and table, pgconverge.stream_rows_…) and their size on disk.
	StagedRowTables int64 `json:"staged_row_tables"`
	StagedRowBytes  int64 `json:"staged_row_bytes"`
}

// readStreaming fills in s.Streaming from src's pg_stat_replication_slots and tgt's staging.
func readStreaming(ctx context.Context, src, tgt *pgx.Conn, s *SlotStatus) error {
	if !s.Exists || pgsession.MajorVersion(src.PgConn()) < 14 {
		return nil
	}
	st := &StreamingStatus{}
	err := src.QueryRow(ctx, `select spill_bytes, spill_txns, stream_bytes, stream_txns from pg_stat_replication_slots where slot_name = $1`, s.Name).
		Scan(&st.SpillBytes, &st.SpillTransactions, &st.StreamBytes, &st.StreamTransactions)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the decoding statistics of slot %q (pg_stat_replication_slots): %w", s.Name, err)
	}
	err = tgt.QueryRow(ctx, `select count(distinct xid), count(*), coalesce(sum(length(data)), 0) from pgconverge.stream_staging where slot = $1`, s.Name).
		Scan(&st.OpenTransactions, &st.StagedMessages, &st.StagedBytes)
	if err != nil {
		return fmt.Errorf("read the stream staging of slot %q: %w", s.Name, err)
	}
	err = tgt.QueryRow(ctx, `select count(*), coalesce(sum(pg_total_relation_size(c.oid)), 0) from pg_class c join pg_namespace n on n.oid = c.relnamespace
where n.nspname = 'pgconverge' and c.relkind = 'r' and starts_with(c.relname, $1)`, staging.RowsPrefix(s.Name)).Scan(&st.StagedRowTables, &st.StagedRowBytes)
	if err != nil {
		return fmt.Errorf("read the row staging tables of slot %q: %w", s.Name, err)
	}
	s.Streaming = st
	return nil
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
		Tables: []TableStatus{}, Backfills: []coverage.RunningBackfill{}, Waiting: rep.Waiting}
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
		if err := readStreaming(ctx, src, tgt, &out.Slots[i]); err != nil {
			return StatusReport{}, err
		}
		// A ledger made before pauses existed has none.
		if out.Slots[i].Controls, err = control.Read(ctx, tgt, s.Name); err != nil && !pgsession.IsCode(err, pgerrcode.UndefinedTable) {
			return StatusReport{}, err
		}
		if out.Slots[i].Controls.Paused == nil {
			out.Slots[i].Controls.Paused = []control.Paused{}
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
	if out.Backfills, err = coverage.RunningBackfills(ctx, tgt); err != nil {
		return StatusReport{}, err
	}
	if out.LastVerify, err = coverage.ReadLastVerify(ctx, tgt); err != nil {
		return StatusReport{}, err
	}
	if out.SlotCreations, err = slotCreations(ctx, src); err != nil {
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
