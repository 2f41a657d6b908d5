package engine

import (
	"context"

	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/cdc"
	"github.com/pgconverge/pgconverge/coverage"
)

// A leader's writes of rows and progress are single transactions that check its epoch FOR SHARE
// (apply.CheckLeaderTx). Its other changes take many transactions, each committing on its own
// (DDL on the target), or happen on the source: those run while a connection holds the epoch
// (apply.HoldEpoch), which a new leader's raise waits for, and which a raise that waited past the
// lease passes only by ending that connection. So a leader frozen (or cut off) before such a
// change and thawed after a takeover changes nothing: its next statement on the target fails,
// and the session ends as fenced (explainByTakeover).

// prepare prepares the target tables and the publication (prepareTarget, preparePublication)
// while the session's target connection holds its epoch: the target tables, types and live views,
// the tables' bookkeeping and the publication's membership change only while this session leads
// the slot.
func (s *session) prepare(ctx context.Context, names []changebatch.TableName) error {
	release, err := apply.HoldEpoch(ctx, s.tgt, s.cfg.Slot, s.epoch)
	if err != nil {
		return err
	}
	defer release()
	s.step("prepare-target")
	if err := s.prepareTarget(ctx); err != nil {
		return err
	}
	if err := s.readControls(ctx); err != nil {
		return err
	}
	s.step("publication")
	return s.preparePublication(ctx, names)
}

// publishHooks returns what the session runs around its change of the publication, on the source,
// while its target connection holds the epoch (prepare). The source is another database, so no
// transaction spans both: the change commits only after a check on the target (BeforeCommit) that
// the hold is still there (the connection answers) and that no new leader's raise waits for it
// (apply.CheckUnchallenged), and the source refuses a commit that comes more than a third of the
// lease after the change (CommitWithin). A raise passes the hold only when the session releases it
// or by ending the target connection once it was seen waiting for the lease (raiseEpoch). So a
// raise that began before the check makes it fail and the change roll back, whether it ended the
// connection or still waits; one that begins after it passes no sooner than a lease later, and by
// then the change committed, within a third of the lease, or was refused by the source. What is
// left is a COMMIT that reached the source in time and took it two thirds of the lease to carry
// out.
func (s *session) publishHooks(ctx context.Context) cdc.PublishHooks {
	return cdc.PublishHooks{
		BeforeAdd: func(adding []changebatch.TableName) error {
			if err := coverage.MarkUnloaded(ctx, s.tgt, s.described(adding)); err != nil {
				return err
			}
			s.cfg.Knobs.beforeFenced("publication")
			return nil
		},
		BeforeCommit: func() error {
			s.cfg.Knobs.beforeFenced("publication commit")
			return apply.CheckUnchallenged(ctx, s.tgt, s.cfg.Slot, s.epoch)
		},
		CommitWithin: s.cfg.Knobs.leaseTimings().Term / 3,
	}
}
