package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/internal/control"
	"github.com/pgconverge/pgconverge/internal/pacing"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// DefaultWALBudget is the WAL budget (Config.WALBudget) of a source that keeps WAL for slots
// without limit (max_slot_wal_keep_size = -1): 16 GiB.
const DefaultWALBudget = 16 << 30

// sourceLoadEvery is how often the daemon samples the source's load and its slot's WAL.
const sourceLoadEvery = 5 * time.Second

// Shares of the WAL budget: from walHoldShare on, backfills and verifies wait; below
// walReleaseShare they go on; from walWarnShare on the daemon warns and resumes a paused stream.
const (
	walHoldShare    = 0.5
	walReleaseShare = 0.25
	walWarnShare    = 0.8
	walWarnEvery    = 5 * time.Minute
)

// LoadLimits are the limits of the source's load past which the daemon's backfills and verifies
// wait (`run --pace`), sampled every 5 s; a limit of 0 is not checked. Loads (initial and gap
// loads, before the stream starts) wait for the standby lag and the active sessions only.
type LoadLimits struct {
	Enabled bool
	// StandbyLagBytes: the largest replay lag of the source's physical standbys
	// (pg_stat_replication: the source's WAL position minus replay_lsn), in bytes.
	StandbyLagBytes int64
	// StreamLagBytes: the WAL between the source's position and the slot's confirmed_flush_lsn.
	StreamLagBytes int64
	// ActiveSessions: the source's client backends running a statement (pg_stat_activity, state
	// active), pgconverge's own left out.
	ActiveSessions int
}

// DefaultLoadLimits are `run --pace`'s limits: 256 MiB of standby lag, 1 GiB of stream lag and
// 32 active sessions.
var DefaultLoadLimits = LoadLimits{StandbyLagBytes: 256 << 20, StreamLagBytes: 1 << 30, ActiveSessions: 32}

// validate returns an error naming the flags when a limit is negative.
func (l LoadLimits) validate() error {
	if l.StandbyLagBytes < 0 || l.StreamLagBytes < 0 || l.ActiveSessions < 0 {
		return errors.New("--pace-standby-lag, --pace-stream-lag and --pace-active-sessions cannot be negative: use 0 to leave one unchecked")
	}
	return nil
}

// sourceLoad is one sample of the source (readSourceLoad).
type sourceLoad struct {
	// slotExists says the daemon's slot exists; held is the WAL it holds (the WAL position minus
	// restart_lsn) and streamLag the WAL past its confirmed_flush_lsn, in bytes.
	slotExists      bool
	held, streamLag int64
	keepSize        int64 // max_slot_wal_keep_size in bytes, -1 for no limit
	standbyLag      int64 // the largest replay lag of a physical standby, bytes
	hiddenStandbys  int64 // standbys whose replay_lsn this role may not see (pg_monitor)
	activeSessions  int64
	hiddenActivity  bool // other roles' sessions show no state to this role (pg_read_all_stats)
}

// readSourceLoad samples the source over conn for the daemon's slot.
func readSourceLoad(ctx context.Context, conn *pgx.Conn, slot string) (sourceLoad, error) {
	var l sourceLoad
	var held, lag *int64
	// pg_stat_replication lists logical walsenders too (the daemon's own stream among them): the
	// physical standbys are the others. Without pg_read_all_stats, another role's walsender shows
	// its pid only (state null).
	err := conn.QueryRow(ctx, `with n as (select case when pg_is_in_recovery() then pg_last_wal_replay_lsn() else pg_current_wal_lsn() end as lsn),
		physical as (select * from pg_stat_replication r where not exists (
			select from pg_replication_slots s where s.slot_type = 'logical' and s.active_pid = r.pid))
		select pg_wal_lsn_diff(n.lsn, s.restart_lsn)::bigint, pg_wal_lsn_diff(n.lsn, s.confirmed_flush_lsn)::bigint,
			s.slot_name is not null,
			pg_size_bytes(current_setting('max_slot_wal_keep_size')),
			coalesce((select max(pg_wal_lsn_diff(n.lsn, replay_lsn))::bigint from physical where replay_lsn is not null), 0),
			(select count(*) from physical where state is null),
			(select count(*) from pg_stat_activity where state = 'active' and backend_type = 'client backend'
				and pid <> pg_backend_pid() and application_name not like 'pgconverge%'),
			exists (select from pg_stat_activity where backend_type = 'client backend' and state is null and pid <> pg_backend_pid())
		from n left join pg_replication_slots s on s.slot_name = $1 and s.database = current_database()`, slot).Scan(
		&held, &lag, &l.slotExists, &l.keepSize, &l.standbyLag, &l.hiddenStandbys, &l.activeSessions, &l.hiddenActivity)
	if err != nil {
		return l, fmt.Errorf("sample the source's load and slot %q: %w", slot, err)
	}
	if held != nil {
		l.held = max(*held, 0)
	}
	if lag != nil {
		l.streamLag = max(*lag, 0)
	}
	return l, nil
}

// budget returns the WAL budget in bytes: cfg's, lowered to max_slot_wal_keep_size, or that
// size, or DefaultWALBudget.
func (l sourceLoad) budget(cfg Config) int64 {
	b := cfg.WALBudget
	if l.keepSize > 0 && (b == 0 || b > l.keepSize) {
		b = l.keepSize
	}
	if b == 0 {
		b = DefaultWALBudget
	}
	return b
}

// loadWatch is watchSourceLoad's state between samples.
type loadWatch struct {
	cfg        Config
	walHeld    bool
	warnedAt   time.Time
	loadReason map[string]string // path -> why its load hold is on ("" when off)
	hintedPriv bool
}

// watchSourceLoad samples the source every sourceLoadEvery until ctx ends (pollEvery) and acts on
// the samples (loadWatch.act): the WAL budget and, with Config.Pacing, the load limits. A failed
// sample is logged at WARN when its error changes; the holds stay as they were.
func watchSourceLoad(ctx context.Context, cfg Config) {
	w := &loadWatch{cfg: cfg, loadReason: map[string]string{}}
	lastErr := ""
	pollEvery(ctx, knobOr(cfg.Knobs.SourceLoadEvery, sourceLoadEvery), cfg.Source, "source", func(ctx context.Context, conn *pgx.Conn) error {
		l, err := readSourceLoad(ctx, conn, cfg.Slot)
		if err != nil {
			return err
		}
		w.act(ctx, l)
		lastErr = ""
		return nil
	}, func(err error) {
		if err.Error() != lastErr {
			lastErr = err.Error()
			cfg.Logger.Warn("source load and slot WAL not sampled: pacing keeps its last state", "slot", cfg.Slot, "err", err)
		}
	})
}

// act applies one sample: the WAL budget (holds the backfills' and verifies' reads from half of
// it until a quarter; from 80% warns and lifts what keeps the slot from moving: a stream pause,
// and while no stream runs an operator's backfill pause and the load pacing of the loads), then
// the load limits.
func (w *loadWatch) act(ctx context.Context, l sourceLoad) {
	cfg, pace, mon := w.cfg, w.cfg.pace, w.cfg.monitor()
	if !l.slotExists {
		w.setWALHold(false, "")
		w.pace(l, false)
		return
	}
	budget := l.budget(cfg)
	share := float64(l.held) / float64(budget)
	attrs := []any{"slot", cfg.Slot, "holds", humanize.IBytes(uint64(l.held)), "budget", humanize.IBytes(uint64(budget))}
	switch {
	case share >= walHoldShare && !w.walHeld:
		w.setWALHold(true, fmt.Sprintf("slot %s holds %s of WAL, half or more of its budget %s: backfills and verifies wait for the stream to catch up",
			cfg.Slot, humanize.IBytes(uint64(l.held)), humanize.IBytes(uint64(budget))))
		cfg.Logger.Warn("backfills and verifies wait: the slot holds half its WAL budget or more, and they go on once the stream brings it under a quarter", attrs...)
	case share < walReleaseShare && w.walHeld:
		w.setWALHold(false, "")
		cfg.Logger.Info("backfills and verifies go on: the slot holds less than a quarter of its WAL budget", attrs...)
	}
	over := share >= walWarnShare
	if over {
		var lift []string
		if pace.paused() {
			lift = append(lift, control.Stream)
		}
		if _, held := pace.load.Holds()[pacing.CausePaused]; held && !pace.streaming.Load() {
			lift = append(lift, control.Backfill) // a load before the stream holds the slot back
		}
		if len(lift) > 0 {
			w.resume(ctx, lift, attrs)
		}
		if time.Since(w.warnedAt) >= walWarnEvery {
			w.warnedAt = time.Now()
			cfg.Logger.Warn("the slot holds 80% of its WAL budget or more: past max_slot_wal_keep_size the source invalidates it and the tables must be loaded again",
				append(attrs, "fix", "find why the stream is behind (pgconverge status, the lag metrics); raise max_slot_wal_keep_size or --wal-budget if the source's disk allows")...)
		}
	}
	mon.PacingHeld("backfill", pacing.CauseWALBudget, w.walHeld)
	mon.PacingHeld("verify", pacing.CauseWALBudget, w.walHeld)
	w.pace(l, over && !pace.streaming.Load())
}

// resume lifts the operator's pauses of parts, since the slot reached 80% of the WAL budget and
// a pause must not cost it: it deletes them from the ledger and says so at WARN; a failure is
// logged at ERROR and tried again at the next sample.
func (w *loadWatch) resume(ctx context.Context, parts []string, attrs []any) {
	cfg := w.cfg
	attrs = append(attrs, "what", parts)
	err := func() error {
		conn, err := pgsession.Connect(ctx, cfg.Target, "target")
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		_, err = control.Resume(ctx, conn, cfg.Slot, parts)
		return err
	}()
	if err != nil {
		cfg.Logger.Error("a pause must end, the slot nears its WAL budget, but it could not be lifted: the next sample tries again",
			append(attrs, "err", err, "fix", "pgconverge resume")...)
		return
	}
	cfg.pace.lift(cfg, parts)
	cfg.Logger.Warn("resumed by itself: the slot holds 80% of its WAL budget or more, and a pause must not cost the slot", attrs...)
}

// setWALHold holds or releases the WAL budget's hold of the backfills and verifies.
func (w *loadWatch) setWALHold(on bool, why string) {
	w.walHeld = on
	hold(w.cfg.pace.backfill, on, pacing.CauseWALBudget, why)
	hold(w.cfg.pace.verify, on, pacing.CauseWALBudget, why)
}

// pace applies the load limits (Config.Pacing) to each path's reads, logging each change of a
// path's hold with its reasons; with spareLoads the loads are not held (the slot nears its WAL
// budget while no stream runs: only the loads' end lets the stream start).
func (w *loadWatch) pace(l sourceLoad, spareLoads bool) {
	cfg, lim := w.cfg, w.cfg.Pacing
	if !lim.Enabled {
		return
	}
	if (l.hiddenStandbys > 0 || l.hiddenActivity) && !w.hintedPriv {
		w.hintedPriv = true
		cfg.Logger.Warn("pacing cannot see every standby's replay position or every session's state on the source: it paces by what it sees",
			"slot", cfg.Slot, "fix", "GRANT pg_monitor TO the source role pgconverge connects as")
	}
	var common, streaming []string
	if lim.StandbyLagBytes > 0 && l.standbyLag > lim.StandbyLagBytes {
		common = append(common, fmt.Sprintf("a standby replays %s behind (limit %s)", humanize.IBytes(uint64(l.standbyLag)), humanize.IBytes(uint64(lim.StandbyLagBytes))))
	}
	if lim.ActiveSessions > 0 && l.activeSessions > int64(lim.ActiveSessions) {
		common = append(common, fmt.Sprintf("%d sessions are active (limit %d)", l.activeSessions, lim.ActiveSessions))
	}
	if lim.StreamLagBytes > 0 && l.streamLag > lim.StreamLagBytes {
		streaming = append(streaming, fmt.Sprintf("the stream is %s behind (limit %s)", humanize.IBytes(uint64(l.streamLag)), humanize.IBytes(uint64(lim.StreamLagBytes))))
	}
	p := cfg.pace
	loads := common
	if spareLoads {
		loads = nil
	}
	for _, path := range []struct {
		name    string
		pacer   *pacing.Pacer
		reasons []string
	}{{"load", p.load, loads}, {"backfill", p.backfill, append(common[:len(common):len(common)], streaming...)}, {"verify", p.verify, append(common[:len(common):len(common)], streaming...)}} {
		why := strings.Join(path.reasons, "; ")
		if why == w.loadReason[path.name] {
			continue
		}
		w.loadReason[path.name] = why
		hold(path.pacer, why != "", pacing.CauseLoad, why)
		cfg.monitor().PacingHeld(path.name, pacing.CauseLoad, why != "")
		if why != "" {
			cfg.Logger.Info("pacing: reads of the source wait, the source is under load", "slot", cfg.Slot, "path", path.name, "because", why)
		} else {
			cfg.Logger.Info("pacing: reads of the source go on, its load is under the limits", "slot", cfg.Slot, "path", path.name)
		}
	}
}
