package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/backfillrun"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// preflight runs, before the session writes anything to either side, every check that can refuse
// the run and can be made without writing: the publication as the tables would use it and the
// source role's privileges to create or extend it (cdc.CheckPublication), an existing slot's
// plugin and database, a cutover recorded in the target under any slot (the target is the
// application's then),
// and the target role's privileges, the types the target tables need and existing target tables
// pgconverge did not make (backfillrun.CheckTargetCreatable). It opens the session's replication connection, which checks the
// REPLICATION attribute and pg_hba.conf. Refusals are permanent and reported all at once; a lost
// connection is returned as it is, for the daemon to retry.
func (s *session) preflight(ctx context.Context, names []changebatch.TableName) error {
	var errs []error
	if err := cdc.CheckPublication(ctx, s.src, s.cfg.Publication, names); err != nil {
		if decide(err) != stop {
			return err
		}
		errs = append(errs, err)
	}
	slot, err := cdc.ReadSlot(ctx, s.src, s.cfg.Slot)
	if err != nil {
		return err
	}
	if slot.Exists {
		if err := slot.Usable(s.cfg.Slot, s.src.Config().Database); err != nil {
			errs = append(errs, err)
		}
	}
	if c, cut, err := coverage.LatestCutover(ctx, s.tgt); err != nil {
		return err
	} else if cut {
		errs = append(errs, fmt.Errorf("slot %q was cut over into this target at %s (%s, pgconverge.cutovers): the target is the application's now and pgconverge follows nothing into it, under any slot; to replicate into it again, start over (docs/cutover.md, \"Starting over\"), or replicate into another database",
			c.Slot, c.CutLSN, c.CutAt.Format(time.RFC3339)))
	}
	all := append(slices.Clone(s.tables), s.snapshotOnly...)
	if err := backfillrun.CheckTargetCreatable(ctx, s.src, s.tgt, all, s.cfg.LiveSuffix); err != nil {
		if decide(err) != stop {
			return err
		}
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return permanent(errors.Join(errs...))
	}
	if s.repl, err = pgsession.ConnectReplication(ctx, s.cfg.Source); err != nil {
		return err
	}
	return nil
}
