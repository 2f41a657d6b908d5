package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/disposition"
	"github.com/pgconverge/pgconverge/internal/lease"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/migrations"
)

// standbyPoll is how often a standby tries the slot's leader lock; the lock's checks and its
// lease run on the lease's timings (lease.Default, or Knobs.Lease).
const standbyPoll = 250 * time.Millisecond

// errLeadershipLost ends a session whose lock connection to the target failed: the leader lock
// may be another daemon's now. The next session, started at once, waits for the lock like a
// standby.
var errLeadershipLost = disposition.New("lost the connection that holds the slot's leader lock on the target",
	disposition.Mark{Action: disposition.Restart, Reason: disposition.ReasonLeadership})

// lead makes the session the leader of its slot before it writes anything but the metadata
// schema to the target (apply.LockLeader, apply.Lead): on a connection of its own it takes the
// slot's leader lock, waiting as a standby while another daemon holds it (waited is then true,
// and the replication connection is closed meanwhile), then raises the slot's epoch, which every
// stream and backfill transaction of the session checks. It brings the metadata schema up to
// date first (the leaders table is part of it). A goroutine then checks the lock connection
// every lease.CheckEvery and ends the session (lost) when it fails.
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
		if err := s.checkLike(ctx, current); err != nil {
			return false, err
		}
		if s.repl != nil {
			s.repl.Close(ctx)
			s.repl = nil
		}
		s.mon.Leading(slot, false)
		s.cfg.Logger.Info("standby: another daemon leads this slot; this one takes over when that one stops, dies, loses its connection to the target or stays silent for the lease",
			"slot", slot, "leader", current.Holder, "epoch", current.Epoch, "since", current.AcquiredAt, "lease", s.cfg.Knobs.leaseTimings().Term.String())
		if err := s.waitAsStandby(ctx, lock); err != nil {
			return true, err
		}
	}
	if s.epoch, err = s.raiseEpoch(ctx, lock); err != nil {
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
	if rerr != nil {
		// The new leader may have ended this session's target connections: look on a new one.
		rctx, cancel := context.WithTimeout(ctx, s.cfg.Knobs.leaseTimings().CheckTimeout)
		defer cancel()
		conn, cerr := pgsession.Connect(rctx, s.cfg.Target, "target")
		if cerr != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		l, ok, rerr = apply.ReadLeader(rctx, conn, s.cfg.Slot)
	}
	if rerr != nil || !ok || l.Epoch == s.epoch {
		return err
	}
	return fmt.Errorf("%w; the session ended with: %w", &apply.FencedError{Slot: s.cfg.Slot, Epoch: s.epoch, Current: l.Epoch, Holder: l.Holder}, err)
}

// settings describes what every daemon of the slot must share: the publication and the tables it
// selects (the --tables items as given, sorted, or the publication's tables).
func (s *session) settings() string {
	tables := "the publication's tables"
	if len(s.cfg.Tables) > 0 {
		var items []string
		for _, v := range s.cfg.Tables {
			for _, item := range strings.Split(v, ",") {
				if item = strings.TrimSpace(item); item != "" {
					items = append(items, item)
				}
			}
		}
		slices.Sort(items)
		tables = strings.Join(slices.Compact(items), ",")
	}
	return fmt.Sprintf("publication %s, tables %s", s.cfg.Publication, tables)
}

// checkLike refuses to wait as a standby of a leader with other settings, or for a target whose
// ledger follows another source: it would take over a stream it cannot continue. The errors are
// permanent: retrying does not change the settings.
func (s *session) checkLike(ctx context.Context, leader apply.Leader) error {
	if leader.Settings != "" && leader.Settings != s.settings() {
		return permanent(fmt.Errorf("slot %q is led by %s with other settings (%s) than this daemon's (%s): every daemon of a slot needs the same --publication and --tables; start this one with the leader's, or stop every daemon of the slot and start them all with the new ones",
			s.cfg.Slot, leader.Holder, leader.Settings, s.settings()))
	}
	if err := coverage.CheckSource(ctx, s.tgt, s.cfg.Slot, s.sourceID); err != nil {
		return refusal(err)
	}
	return nil
}

// waitAsStandby polls the leader lock every standbyPoll until it gets it; when the holder's session
// has been silent for lease.Term (apply.LeaderLockHolder), it ends that session, logged at WARN.
func (s *session) waitAsStandby(ctx context.Context, lock *pgx.Conn) error {
	slot := s.cfg.Slot
	term := s.cfg.Knobs.leaseTimings().Term
	if err := apply.MarkStandby(ctx, lock, slot, true); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(standbyPoll):
		}
		ok, err := apply.LockLeader(ctx, lock, slot, false)
		if err != nil {
			return err
		}
		if ok {
			return apply.MarkStandby(ctx, lock, slot, false)
		}
		pid, silent, err := apply.LeaderLockHolder(ctx, s.tgt, slot)
		if err != nil {
			return err
		}
		if pid != 0 && silent > term.Seconds() {
			s.cfg.Logger.Warn("the leader's lock session has been silent past the lease (a frozen process, or a network that broke without resetting the connection): ending it to take over",
				"slot", slot, "target_pid", pid, "silent_seconds", int(silent), "lease", term.String())
			if _, err := s.tgt.Exec(ctx, `select pg_terminate_backend($1)`, pid); err != nil {
				return fmt.Errorf("end the silent leader's session %d on the target (the target role needs to be that session's role or a member of pg_signal_backend): %w", pid, err)
			}
		}
	}
}

// raiseEpoch raises the slot's epoch over lock (apply.Lead). Sessions and transactions of the
// previous leader (or of backfill workers that joined its runs) that hold the epoch hold it off;
// any still doing so once the raise has been seen waiting for lease.Term (looked at every
// standbyPoll) belong to a process that lost the lock and is frozen or cut off, and are ended
// (logged at WARN), from then on every standbyPoll: the raise waits for the holders of the
// epoch's lock, then of the row's shared lock, and each must go. The lease counts from a wait
// seen on the target, not from the start of the raise, so a holder that saw no raise waiting
// (apply.CheckUnchallenged) keeps the epoch for at least a lease from then (publishHooks).
func (s *session) raiseEpoch(ctx context.Context, lock *pgx.Conn) (int64, error) {
	done := make(chan struct{})
	exited := make(chan struct{})
	pid := lock.PgConn().PID()
	term := s.cfg.Knobs.leaseTimings().Term
	go func() {
		defer close(exited)
		var waiting time.Time // when the raise was first seen waiting
		for {
			select {
			case <-done:
				return
			case <-time.After(standbyPoll):
			}
			if waiting.IsZero() {
				var blocked bool
				if err := s.tgt.QueryRow(ctx, `select cardinality(pg_blocking_pids($1)) > 0`, pid).Scan(&blocked); err == nil && blocked {
					waiting = time.Now()
				}
				continue
			}
			if time.Since(waiting) < term {
				continue
			}
			rows, err := s.tgt.Query(ctx, `select b from unnest(pg_blocking_pids($1)) b where pg_terminate_backend(b)`, pid)
			if err != nil {
				continue
			}
			ended, err := pgx.CollectRows(rows, pgx.RowTo[int32])
			if err == nil && len(ended) > 0 {
				s.cfg.Logger.Warn("ended sessions and transactions that held off the epoch raise past the lease (the previous leader's, or its joined backfill workers')", "slot", s.cfg.Slot, "target_pids", ended)
			}
		}
	}()
	epoch, err := apply.Lead(ctx, lock, s.cfg.Slot, lease.Holder(), s.settings())
	close(done)
	<-exited
	return epoch, err
}

// watchLock checks the lock connection every lease.CheckEvery until ctx ends; when it fails it
// ends the session with errLeadershipLost. It is the lock connection's only user meanwhile.
func (s *session) watchLock(ctx context.Context, lost context.CancelCauseFunc) {
	defer close(s.watching)
	timings := s.cfg.Knobs.leaseTimings()
	t := time.NewTicker(timings.CheckEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		checkCtx, cancel := context.WithTimeout(ctx, timings.CheckTimeout)
		_, err := s.lock.Exec(checkCtx, "select 1")
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				// Say so at once: the session may take a while to end (an apply under way on a
				// connection as broken as this one is given 30 s).
				s.mon.Leading(s.cfg.Slot, false)
				s.cfg.Logger.Warn("the leader lock's connection failed: this daemon stops leading the slot and ends its session", "slot", s.cfg.Slot, "epoch", s.epoch, "err", err)
				lost(fmt.Errorf("%w: %w", errLeadershipLost, err))
			}
			return
		}
	}
}
