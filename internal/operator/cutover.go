package operator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/engine"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/internal/sequences"
	"github.com/pgconverge/pgconverge/internal/verify"
	"github.com/pgconverge/pgconverge/migrations"
)

// CutoverConfig configures Cutover (`pgconverge cutover`).
type CutoverConfig struct {
	// Run is the daemon's configuration (URLs, slot, publication, tables, backfill sizes): the
	// cutover streams with it until the target caught up.
	Run engine.Config
	// SkipVerify leaves out the verify step; DropSlot drops the slot once the tables are retired
	// (else it keeps the source's WAL: the report says so), DropPublication the publication,
	// Finalize turns the target tables into plain tables with the source's schema objects (finalize).
	SkipVerify, DropSlot, DropPublication, Finalize bool
	// PauseWrites, when set, names the role the application writes as: the switchover pauses
	// its writes on the source first (pauseWrites), rehearses the finalize before it records the
	// cutover, finalizes (Finalize is implied), and on a failure before the cutover is recorded
	// gives the writes back. ResumeWrites only gives back the writes a pause left revoked.
	PauseWrites  string
	ResumeWrites bool
	// CarryOwnership gives each finalized table the source table's owner and grants (the roles
	// must exist on the target, and the target role must be able to SET ROLE to the owner).
	CarryOwnership bool
	// Timeout bounds the catch-up (default 10m).
	Timeout time.Duration
	// AfterStep, a test hook, runs after each step is done: "caught-up", "verified",
	// "sequences", "recorded", "slot-dropped", "finalized-table" (each table), "finalized"; with
	// PauseWrites also "paused" (first) and "rehearsed" (before "recorded").
	AfterStep func(step string)
}

// step runs the AfterStep hook, if any, for step.
func (c CutoverConfig) step(step string) {
	if c.AfterStep != nil {
		c.AfterStep(step)
	}
}

// CutoverReport says what a cutover did; steps done by an earlier run are reported as done.
type CutoverReport struct {
	Slot string `json:"slot"`
	// CutLSN is the source position the target holds every change up to; VerifiedLSN the exact
	// snapshot at which verify found source and target equal ("" when skipped).
	CutLSN      string   `json:"cut_lsn"`
	VerifiedLSN string   `json:"verified_lsn,omitempty"`
	Tables      []string `json:"tables"`
	// Sequences are the sequences synced (SyncSequences).
	Sequences []sequences.Line `json:"sequences"`
	// SlotDropped, PublicationDropped and Finalized report the optional steps.
	SlotDropped        bool     `json:"slot_dropped"`
	PublicationDropped bool     `json:"publication_dropped"`
	Finalized          []string `json:"finalized,omitempty"`
	// Carried are the source's schema objects finalize gave the target tables, "table: kind
	// object" (tableschema.Carry); TargetOnly the objects only the target has, which it left.
	Carried    []string `json:"carried,omitempty"`
	TargetOnly []string `json:"target_only,omitempty"`
	// Resumed is true when an earlier run had cut over already and this one did the rest.
	Resumed bool `json:"resumed"`
	// PausedRole is the role whose writes were paused (PauseWrites); WritePauseSeconds how long
	// they were, from the revoke to the end of the finalize (0 when the pause began in an
	// earlier run); WritesGivenBack is set when the cutover failed and gave them back.
	PausedRole        string  `json:"paused_role,omitempty"`
	WritePauseSeconds float64 `json:"write_pause_seconds,omitempty"`
	WritesGivenBack   bool    `json:"writes_given_back,omitempty"`
}

// ErrDaemonRunning is wrapped by Cutover's error when a walsender holds the slot: the daemon must
// be stopped first, so that the cutover's own stream is the last.
var ErrDaemonRunning = errors.New("a daemon streams from the slot")

// Cutover is `pgconverge cutover`, run once the application stopped writing to the source:
//  1. with the daemon stopped (a walsender on the slot: ErrDaemonRunning), it streams as the
//     daemon does (Run, loading what has a gap) until the target's progress reaches the source
//     position read when it started, and checks that coverage has no gap;
//  2. still streaming, it verifies every table (Verify with repair: a discrepancy left open is an
//     error) and syncs the sequences (SyncSequences);
//  3. it stops streaming, checks that the slot holds no transaction committed after the target's
//     progress (checkQuiet: the application still writes), and records the cutover
//     (coverage.RecordCutover): the stream segment ends, the tables are retired, so coverage
//     reports no gap for them;
//  4. optionally it drops the slot and the publication, and finalizes the target tables.
//
// With PauseWrites it is a switchover: it pauses the role's writes on the source before step 1
// (pauseWrites), rehearses the finalize before step 3 (rehearseFinalize), finalizes, and reports
// the write pause; a failure before step 3 gives the writes back (WritesGivenBack).
//
// Run again after a crash, it resumes: before step 3 it starts over (every step is idempotent;
// a pause left open is taken over, or given back when PauseWrites is not set), after it, it does
// the optional steps still to do.
func Cutover(ctx context.Context, cfg CutoverConfig) (CutoverReport, error) {
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Minute
	}
	rc := cfg.Run
	rep := CutoverReport{Slot: rc.Slot}
	src, tgt, err := pgsession.ConnectBoth(ctx, rc.Source, rc.Target)
	if err != nil {
		return rep, err
	}
	defer pgsession.CloseBoth(context.WithoutCancel(ctx), src, tgt)
	if ok, err := apply.HasMetadata(ctx, tgt); err != nil {
		return rep, err
	} else if !ok {
		return rep, errors.New("the target has no pgconverge ledger (schema pgconverge): nothing to cut over; run pgconverge run first")
	}
	if err := migrations.Apply(ctx, tgt); err != nil {
		return rep, err
	}
	if cfg.ResumeWrites {
		rep.PausedRole, err = giveBack(ctx, cfg, src, tgt)
		rep.WritesGivenBack = rep.PausedRole != ""
		return rep, err
	}
	if cfg.PauseWrites != "" {
		cfg.Finalize = true
		rep.PausedRole = cfg.PauseWrites
	}
	done, resumed, err := coverage.ReadCutover(ctx, tgt, rc.Slot)
	if err != nil {
		return rep, err
	}
	pause, err := openPause(ctx, tgt, rc.Slot)
	if err != nil {
		return rep, err
	}
	if !resumed {
		if pause, err = startPause(ctx, cfg, src, tgt); err != nil {
			return rep, err
		}
		if done, err = cutOver(ctx, cfg, src, tgt, &rep); err != nil {
			if pause != nil {
				rep.WritesGivenBack = true
				_, gerr := giveBack(context.WithoutCancel(ctx), cfg, src, tgt)
				err = errors.Join(err, gerr)
			}
			return rep, err
		}
	}
	rep.Resumed = resumed
	rep.CutLSN = done.CutLSN.String()
	if done.VerifiedLSN != 0 {
		rep.VerifiedLSN = done.VerifiedLSN.String()
	}
	for _, t := range done.Tables {
		rep.Tables = append(rep.Tables, t.String())
	}
	if err := finishCutover(ctx, cfg, src, tgt, done, &rep); err != nil {
		return rep, err
	}
	if pause != nil {
		rep.PausedRole = pause.role
		rep.WritePauseSeconds = time.Since(pause.at).Seconds()
		rc.Logger.Info("cutover: done; the role's writes stay revoked on the source (the application writes to the target now)",
			"role", pause.role, "write_pause_seconds", fmt.Sprintf("%.1f", rep.WritePauseSeconds))
	}
	return rep, endPause(ctx, tgt, rc.Slot, "cut over")
}

// startPause pauses the application's writes when cfg.PauseWrites is set (pauseWrites); without
// it, it gives back the writes an earlier, interrupted switchover left paused. It returns the
// pause, or nil.
func startPause(ctx context.Context, cfg CutoverConfig, src, tgt *pgx.Conn) (*writePause, error) {
	if cfg.PauseWrites == "" {
		_, err := giveBack(ctx, cfg, src, tgt)
		return nil, err
	}
	p, err := pauseWrites(ctx, cfg, src, tgt)
	if err == nil {
		cfg.step("paused")
	}
	return p, err
}

// giveBack gives back the writes the open pause of the slot revoked (giveBackWrites), on the
// source's writable server, and returns the paused role ("" when no pause was open).
func giveBack(ctx context.Context, cfg CutoverConfig, src, tgt *pgx.Conn) (string, error) {
	w, done, err := writer(ctx, src, cfg.Run.Primary)
	if err != nil {
		return "", err
	}
	defer done()
	return giveBackWrites(ctx, w, tgt, cfg.Run.Slot, cfg.Run.Logger.Warn)
}

// cutOver does steps 1 to 3 of Cutover and returns the recorded cutover.
func cutOver(ctx context.Context, cfg CutoverConfig, src, tgt *pgx.Conn, rep *CutoverReport) (coverage.Cutover, error) {
	rc := cfg.Run
	log := rc.Logger
	slot, err := cdc.ReadSlot(ctx, src, rc.Slot)
	if err != nil {
		return coverage.Cutover{}, err
	}
	if !slot.Exists {
		return coverage.Cutover{}, fmt.Errorf("slot %q does not exist on the source: there is no stream to cut over (a wrong --slot?)", rc.Slot)
	}
	if slot.ActivePID != 0 {
		return coverage.Cutover{}, fmt.Errorf("%w: slot %q is held by walsender pid %d: stop pgconverge run first (systemctl stop pgconverge, or SIGTERM), then run cutover again", ErrDaemonRunning, rc.Slot, slot.ActivePID)
	}
	target, err := cutPosition(ctx, src, rc.Primary)
	if err != nil {
		return coverage.Cutover{}, err
	}
	log.Info("cutover: streaming until the target holds every change up to the source's current position", "slot", rc.Slot, "target_lsn", target.String())
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	runDone := make(chan error, 1)
	go func() { runDone <- engine.Run(runCtx, rc) }()
	stop := func() error {
		stopRun()
		return <-runDone
	}
	if err := waitProgress(ctx, tgt, rc.Slot, target, cfg.Timeout, runDone); err != nil {
		stopRun()
		return coverage.Cutover{}, err
	}
	cfg.step("caught-up")
	covRep, err := CoverageReport(ctx, CoverageConfig{Source: rc.Source, Target: rc.Target, Slot: rc.Slot})
	if err != nil {
		return coverage.Cutover{}, errors.Join(err, stop())
	}
	var tables []changebatch.TableName
	var failing []string
	for _, t := range covRep.Tables {
		if t.Slot != rc.Slot {
			continue
		}
		n, err := changebatch.ParseTableName(t.Table)
		if err != nil {
			return coverage.Cutover{}, errors.Join(err, stop())
		}
		tables = append(tables, n)
		if t.Status.Failing() {
			failing = append(failing, t.Table+" ("+string(t.Status)+")")
		}
	}
	if len(failing) > 0 {
		return coverage.Cutover{}, errors.Join(fmt.Errorf("coverage is not complete for %s: see pgconverge coverage; nothing was cut over", strings.Join(failing, ", ")), stop())
	}
	names := make([]string, len(tables))
	for i, t := range tables {
		names[i] = t.String()
	}
	var verified pglogrepl.LSN
	if !cfg.SkipVerify && len(names) > 0 {
		log.Info("cutover: verifying, with repair", "tables", len(names))
		vrep, err := verify.Run(ctx, verify.Config{Source: rc.Source, Primary: rc.Primary, Target: rc.Target, Tables: names, Repair: true, Logger: log})
		if err == nil && vrep.Open > 0 {
			err = fmt.Errorf("verify left %d discrepancies open: see pgconverge verify; nothing was cut over", vrep.Open)
		}
		if err != nil {
			return coverage.Cutover{}, errors.Join(err, stop())
		}
		if verified, err = pglogrepl.ParseLSN(vrep.Snapshot); err != nil {
			return coverage.Cutover{}, errors.Join(err, stop())
		}
		cfg.step("verified")
	}
	if len(names) > 0 {
		seqSource, err := sequenceSource(ctx, src, rc.Source, rc.Primary)
		if err != nil {
			return coverage.Cutover{}, errors.Join(err, stop())
		}
		if rep.Sequences, err = sequences.Sync(ctx, sequences.Config{Source: seqSource, Target: rc.Target, Tables: names, Logger: log}); err != nil {
			return coverage.Cutover{}, errors.Join(err, stop())
		}
		cfg.step("sequences")
	}
	if err := stop(); err != nil {
		return coverage.Cutover{}, err
	}
	if cfg.PauseWrites != "" {
		if err := rehearseFinalize(ctx, src, tgt, tables, cfg.CarryOwnership); err != nil {
			return coverage.Cutover{}, err
		}
		cfg.step("rehearsed")
	}
	cut, _, err := apply.ReadProgress(ctx, tgt, rc.Slot)
	if err != nil {
		return coverage.Cutover{}, err
	}
	if err := checkQuiet(ctx, src, rc, cut); err != nil {
		return coverage.Cutover{}, err
	}
	if err := coverage.RecordCutover(ctx, tgt, rc.Slot, cut, verified, tables); err != nil {
		return coverage.Cutover{}, err
	}
	log.Info("cutover: recorded; the tables are retired", "slot", rc.Slot, "cut_lsn", cut.String(), "tables", len(tables))
	cfg.step("recorded")
	c, _, err := coverage.ReadCutover(ctx, tgt, rc.Slot)
	return c, err
}

// checkQuiet returns an error when the slot holds transactions of the publication committed after
// cut, the position the target holds (cdc.PendingTransactions): the application still writes,
// and a cutover now would leave them behind. It waits (up to 30 s) for the stopped stream's
// walsender to let go of the slot, and first for the source to flush the WAL it has written, and a
// standby source to replay its primary's (waitWritten).
func checkQuiet(ctx context.Context, src *pgx.Conn, rc engine.Config, cut pglogrepl.LSN) error {
	// A transaction committed asynchronously may not be flushed yet, and decoding reads only
	// flushed WAL: without the wait, the last writes of an application that commits with
	// synchronous_commit off (up to wal_writer_delay) would look like no writes.
	if err := waitWritten(ctx, src, rc.Primary); err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, err := cdc.PendingTransactions(ctx, src, rc.Slot, rc.Publication, cut)
		switch {
		case errors.Is(err, cdc.ErrSlotBusy) && time.Now().Before(deadline):
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Millisecond):
			}
			continue
		case err != nil:
			return err
		case n > 0:
			return fmt.Errorf("the source still takes writes: %d transactions of publication %q committed after the target caught up at %s; stop the application's writes, then run cutover again (nothing was cut over)",
				n, rc.Publication, cut)
		}
		return nil
	}
}

// waitProgress polls the target's progress for slot until it reaches lsn; it fails when the
// daemon's run ends first (its error), or after timeout.
func waitProgress(ctx context.Context, tgt *pgx.Conn, slot string, lsn pglogrepl.LSN, timeout time.Duration, runDone <-chan error) error {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		progress, _, err := apply.ReadProgress(ctx, tgt, slot)
		if err != nil {
			return err
		}
		if progress >= lsn {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the target reached %s of the source's %s within %s: is the application still writing? stop it, or pass a longer --timeout", progress, lsn, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-runDone:
			return fmt.Errorf("streaming stopped before the target caught up: %w", err)
		case <-tick.C:
		}
	}
}

// finishCutover does the optional steps 4 of Cutover that are still to do.
func finishCutover(ctx context.Context, cfg CutoverConfig, src, tgt *pgx.Conn, done coverage.Cutover, rep *CutoverReport) error {
	rc := cfg.Run
	log := rc.Logger
	rep.SlotDropped = done.SlotDropped != nil
	if cfg.DropSlot && done.SlotDropped == nil {
		if err := cdc.DropSlot(ctx, src, rc.Slot); err != nil && !errors.Is(err, cdc.ErrSlotMissing) {
			return err
		}
		if err := coverage.MarkCutoverStep(ctx, tgt, rc.Slot, "slot_dropped"); err != nil {
			return err
		}
		rep.SlotDropped = true
		log.Info("cutover: dropped the slot", "slot", rc.Slot)
		cfg.step("slot-dropped")
	}
	if !rep.SlotDropped {
		log.Warn("cutover: the slot still keeps the source's WAL: drop it when you no longer need it (SELECT pg_drop_replication_slot('"+rc.Slot+"') on the source, or cutover --drop-slot)", "slot", rc.Slot)
	}
	if cfg.DropPublication {
		if err := dropPublication(ctx, src, rc.Primary, rc.Publication); err != nil {
			return err
		}
		rep.PublicationDropped = true
	}
	if cfg.Finalize {
		return finalize(ctx, cfg, src, tgt, done.Tables, rep)
	}
	return nil
}
