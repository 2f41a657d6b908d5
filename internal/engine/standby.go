package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// replayWait bounds how long a session waits for its standby source to replay the primary's
// change of the publication.
const replayWait = 2 * time.Minute

// connectPrimary notes whether the source is a standby in recovery (cdc.CheckSource has checked
// that it can decode: PostgreSQL 16 or later, hot_standby_feedback on) and, when it is and
// Config.Primary is set, connects to the primary and checks it (cdc.CheckPrimary). A standby
// without --primary is logged at WARN with what it costs.
func (s *session) connectPrimary(ctx context.Context) error {
	var err error
	if s.standby, err = cdc.InRecovery(ctx, s.src); err != nil || !s.standby {
		return err
	}
	if s.cfg.Primary == "" {
		s.cfg.Logger.Warn(cdc.NoPrimaryWarning, "slot", s.cfg.Slot)
		return nil
	}
	if s.primary, err = pgsession.Connect(ctx, s.cfg.Primary, "primary"); err != nil {
		return err
	}
	if err := cdc.CheckPrimary(ctx, s.primary, s.src); err != nil {
		return refusal(err)
	}
	s.cfg.Logger.Info("the source is a standby: its slots decode the WAL it replays; the publication is kept on the primary", "slot", s.cfg.Slot)
	return nil
}

// primaryURL is Config.Primary while the source is a standby, else "": what
// pgsession.LogStandbySnapshots and backfill.Export take.
func (s *session) primaryURL() string {
	if s.standby {
		return s.cfg.Primary
	}
	return ""
}

// publisher is the connection on which the publication is created and changed: the primary's
// when the source is a standby with --primary, else the source's.
func (s *session) publisher() *pgx.Conn {
	if s.primary != nil {
		return s.primary
	}
	return s.src
}

// published follows cdc.EnsurePublication's run on publisher, which added tables and returned
// err: on a standby with --primary, when the standby's catalogs lack the change (tables were
// added, or the publication is missing there), it waits until the standby has replayed the
// primary's WAL up to now (a slot on the standby decodes with the publication as the standby's
// catalogs hold it); on a standby without --primary, a publication that lacks a selected table
// (the standby refuses the change, read-only) is a refusal naming the statement to run on the
// primary (cdc.EnsurePublication names it).
func (s *session) published(ctx context.Context, added []changebatch.TableName, err error) error {
	if s.standby && s.primary == nil && pgsession.IsCode(err, pgerrcode.ReadOnlySQLTransaction) {
		return refusal(fmt.Errorf("%w (or pass --primary, and pgconverge changes the publication there)", err))
	}
	if err != nil || s.primary == nil {
		return err
	}
	if len(added) == 0 {
		exists, err := cdc.PublicationExists(ctx, s.src, s.cfg.Publication)
		if err != nil || exists {
			return err
		}
	}
	at, err := cdc.CurrentLSN(ctx, s.primary)
	if err != nil {
		return err
	}
	if err := cdc.WaitReplayed(ctx, s.src, at, replayWait); err != nil {
		return fmt.Errorf("wait for the standby source to replay the publication's change: %w", err)
	}
	return nil
}
