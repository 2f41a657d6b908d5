package operator

import (
	"context"
	"errors"
	"fmt"

	"github.com/pgconverge/pgconverge/internal/control"
	"github.com/pgconverge/pgconverge/internal/pacing"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/migrations"
)

// PauseConfig configures Pause and Resume (`pgconverge pause`, `pgconverge resume`).
type PauseConfig struct {
	Target string
	// Slot names the daemon, by the slot it streams from.
	Slot string
	// Parts are what to pause or resume (control.ParseParts).
	Parts []string
}

// Validate reports every problem of the configuration at once.
func (c *PauseConfig) Validate() error {
	var errs []error
	if c.Target == "" {
		errs = append(errs, errors.New("no target: pass --target URL or set $PGCONVERGE_TARGET"))
	}
	if c.Slot == "" {
		errs = append(errs, errors.New("--slot is empty: name the slot of the daemon to pause"))
	}
	if len(c.Parts) == 0 {
		errs = append(errs, errors.New("--what names nothing"))
	}
	return errors.Join(errs...)
}

// PauseResult is what Pause or Resume changed: the parts it paused or resumed now, and the
// controls in the ledger after it.
type PauseResult struct {
	Changed []string      `json:"changed"`
	State   control.State `json:"state"`
}

// Pause records cfg.Parts of the slot's daemon as paused in the target's ledger (the metadata
// schema is made or migrated first); a running daemon follows within a second, a restarted one
// from its start. A part paused already keeps its time. The slot is kept: a paused stream holds
// WAL on the source, up to the daemon's WAL budget (`run --wal-budget`), where it resumes by
// itself.
func Pause(ctx context.Context, cfg PauseConfig) (PauseResult, error) {
	return changeControls(ctx, cfg.Target, cfg.Slot, func(q control.Querier, by string) ([]string, error) {
		return control.Pause(ctx, q, cfg.Slot, cfg.Parts, by)
	})
}

// Resume deletes the pauses of cfg.Parts of the slot's daemon; it returns the parts that were
// paused.
func Resume(ctx context.Context, cfg PauseConfig) (PauseResult, error) {
	return changeControls(ctx, cfg.Target, cfg.Slot, func(q control.Querier, _ string) ([]string, error) {
		return control.Resume(ctx, q, cfg.Slot, cfg.Parts)
	})
}

// SetRateLimits changes the rate limits of slot's daemon's backfills and verifies: change gets
// the limits the ledger holds (none when never recorded) and changes them; they are recorded as
// set by by (`backfill --set`, a SIGHUP reload), and returned. The daemon follows within a second.
func SetRateLimits(ctx context.Context, target, slot string, change func(*pacing.Limits), by string) (pacing.Limits, error) {
	var l pacing.Limits
	_, err := changeControls(ctx, target, slot, func(q control.Querier, _ string) ([]string, error) {
		st, err := control.Read(ctx, q, slot)
		if err != nil {
			return nil, err
		}
		if st.Limits != nil {
			l = st.Limits.Limits
		}
		change(&l)
		return nil, control.SetLimits(ctx, q, slot, l, by)
	})
	return l, err
}

// changeControls connects to target, makes the metadata schema current, runs change with the
// connection and the role that changes it (current_user), and reads the controls after it.
func changeControls(ctx context.Context, target, slot string, change func(control.Querier, string) ([]string, error)) (PauseResult, error) {
	var res PauseResult
	tgt, err := pgsession.Connect(ctx, target, "target")
	if err != nil {
		return res, err
	}
	defer tgt.Close(context.WithoutCancel(ctx))
	if err := migrations.Apply(ctx, tgt); err != nil {
		return res, err
	}
	var by string
	if err := tgt.QueryRow(ctx, `select current_user`).Scan(&by); err != nil {
		return res, fmt.Errorf("read the target role: %w", err)
	}
	if res.Changed, err = change(tgt, by); err != nil {
		return res, err
	}
	res.State, err = control.Read(ctx, tgt, slot)
	return res, err
}
