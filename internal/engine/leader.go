package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/migrations"
)

// leaderCheckEvery is how often a leader makes sure its lock connection still holds the leader
// lock (a trivial query on it); a leader whose lock connection ended stops its session within it.
const leaderCheckEvery = 2 * time.Second

// errLeadershipLost ends a session whose lock connection to the target failed: the leader lock
// may be another daemon's now. The next session waits for the lock like a standby.
var errLeadershipLost = errors.New("lost the connection that holds the slot's leader lock on the target")

// holder names this process in pgconverge.leaders and in the logs of standbys: host and pid.
func holder() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown host"
	}
	return fmt.Sprintf("%s pid %d", host, os.Getpid())
}

// lead makes the session the leader of its slot before it writes anything but the metadata
// schema to the target (apply.LockLeader, apply.Lead): on a connection of its own it takes the
// slot's leader lock, waiting as a standby while another daemon holds it (waited is then true,
// and the replication connection is closed meanwhile), then raises the slot's epoch, which every
// stream and backfill transaction of the session checks. It brings the metadata schema up to
// date first (the leaders table is part of it). A goroutine then checks the lock connection
// every leaderCheckEvery and ends the session (lost) when it fails.
func (s *session) lead(ctx context.Context, lost context.CancelCauseFunc) (waited bool, err error) {
	if err := migrations.Apply(ctx, s.tgt); err != nil {
		return false, err
	}
	lock, err := pgsession.Connect(ctx, s.cfg.Target, "target")
	if err != nil {
		return false, err
	}
	s.lock = lock
	slot := s.cfg.Slot
	ok, err := apply.LockLeader(ctx, lock, slot, false)
	if err != nil {
		return false, err
	}
	if !ok {
		current, _, err := apply.ReadLeader(ctx, s.tgt, slot)
		if err != nil {
			return false, err
		}
		if s.repl != nil {
			s.repl.Close(ctx)
			s.repl = nil
		}
		s.mon.Leading(slot, false)
		s.cfg.Logger.Info("standby: another daemon leads this slot; this one takes over when that one stops, dies or loses its connection to the target",
			"slot", slot, "leader", current.Holder, "epoch", current.Epoch, "since", current.AcquiredAt)
		if _, err := apply.LockLeader(ctx, lock, slot, true); err != nil {
			return true, err
		}
	}
	if s.epoch, err = apply.Lead(ctx, lock, slot, holder()); err != nil {
		return !ok, err
	}
	s.mon.Leading(slot, true)
	s.cfg.Logger.Info("leading the slot", "slot", slot, "epoch", s.epoch, "taken_over", !ok)
	s.watching = make(chan struct{})
	go s.watchLock(ctx, lost)
	return !ok, nil
}

// explainByTakeover returns err wrapped with a *apply.FencedError when another daemon became the
// slot's leader since this session led it: a new leader ends the walsender of the old one
// (cdc.TakeSlot), which then fails on a lost connection that the takeover explains. Otherwise,
// or when the leader cannot be read, it returns err.
func (s *session) explainByTakeover(ctx context.Context, err error) error {
	if s.epoch == 0 || lostLeadership(err) || s.tgt == nil {
		return err
	}
	l, ok, rerr := apply.ReadLeader(ctx, s.tgt, s.cfg.Slot)
	if rerr != nil || !ok || l.Epoch == s.epoch {
		return err
	}
	return fmt.Errorf("%w; the session ended with: %w", &apply.FencedError{Slot: s.cfg.Slot, Epoch: s.epoch, Current: l.Epoch, Holder: l.Holder}, err)
}

// watchLock checks the lock connection every leaderCheckEvery until ctx ends; when it fails it
// ends the session with errLeadershipLost. It is the lock connection's only user meanwhile.
func (s *session) watchLock(ctx context.Context, lost context.CancelCauseFunc) {
	defer close(s.watching)
	t := time.NewTicker(leaderCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, err := s.lock.Exec(ctx, "select 1"); err != nil {
			if ctx.Err() == nil {
				lost(fmt.Errorf("%w: %w", errLeadershipLost, err))
			}
			return
		}
	}
}
