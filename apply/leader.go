package apply

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/internal/advisory"
	"github.com/pgconverge/pgconverge/internal/disposition"
)

// Several daemons may run for one slot: exactly one leads (streams and writes), the others wait
// as standbys. Two mechanisms make that safe, the usual pair of a lease and a fencing token
// (Kleppmann, "How to do distributed locking", 2016; Burrows, "The Chubby lock service", §2.4
// sequencers, OSDI 2006):
//   - the leader lock (advisory.Leader): a session advisory lock on the target (PostgreSQL docs
//     §13.3.5 "Advisory Locks") that the leader holds on a connection of its own; PostgreSQL releases it when that
//     session ends, whether the daemon stopped, was killed or lost the connection, and a
//     standby waiting for it gets it then;
//   - the epoch: pgconverge.leaders holds per slot a number that each new leader raises once it
//     holds the lock. Every transaction a leader writes the slot's progress or rows in locks the
//     row FOR SHARE and compares the epoch with its own; raising it takes the row's update lock,
//     which waits for those transactions. So once a new leader raised it, a daemon that lost the
//     lock without knowing it (its lock connection cut, its writes on other connections going on)
//     can never commit again.
//
// Work that spans several transactions of one connection (a session start's schema work, a bulk
// load's key deferral) or reaches the source (a publication change) holds the epoch with a lock
// of that connection's session instead (HoldEpoch), which Lead takes too before it raises.

// MarkStandby takes (standby true) or releases the standby lock of slot in conn's session.
func MarkStandby(ctx context.Context, conn *pgx.Conn, slot string, standby bool) error {
	q := `select ` + advisory.Standby("$1").UnlockShared() + `::text`
	if standby {
		q = `select ` + advisory.Standby("$1").LockShared() + `::text`
	}
	var ignored string
	if err := conn.QueryRow(ctx, q, slot).Scan(&ignored); err != nil {
		return fmt.Errorf("mark this daemon a standby of slot %q on the target: %w", slot, err)
	}
	return nil
}

// MarkRunning takes the running lock of slot, shared, in conn's session, which holds it until the
// session ends: a daemon holds it on a connection of its own for as long as its process runs,
// across its sessions and the backoff between them (while the leader lock is held only during a
// session), so that ReadLeaders reports the slot Running then too.
func MarkRunning(ctx context.Context, conn *pgx.Conn, slot string) error {
	var ignored string
	if err := conn.QueryRow(ctx, `select `+advisory.Running("$1").LockShared()+`::text`, slot).Scan(&ignored); err != nil {
		return fmt.Errorf("mark a daemon of slot %q running on the target: %w", slot, err)
	}
	return nil
}

// LockLeader takes the leader lock of slot in conn's session, which holds it until the session
// ends. With wait it waits for the lock (until ctx ends: pgx then cancels the wait), else it
// returns false at once when another session holds it.
func LockLeader(ctx context.Context, conn *pgx.Conn, slot string, wait bool) (bool, error) {
	q := `select ` + advisory.Leader("$1").TryLock()
	if wait {
		q = `select true from ` + advisory.Leader("$1").Lock()
	}
	var ok bool
	if err := conn.QueryRow(ctx, q, slot).Scan(&ok); err != nil {
		return false, fmt.Errorf("take the leader lock of slot %q on the target: %w", slot, err)
	}
	return ok, nil
}

// Leader is the row of pgconverge.leaders for one slot: its current epoch, who holds it
// (host and process) and since when.
type Leader struct {
	Epoch      int64
	Holder     string
	AcquiredAt string
	// Settings are the leader's settings that every daemon of the slot must share (Lead).
	Settings string
}

// ReadLeader returns slot's leader row, and false when no daemon ever led it.
func ReadLeader(ctx context.Context, conn *pgx.Conn, slot string) (Leader, bool, error) {
	var l Leader
	err := conn.QueryRow(ctx, `select epoch, holder, acquired_at::text, settings from pgconverge.leaders where slot = $1`, slot).
		Scan(&l.Epoch, &l.Holder, &l.AcquiredAt, &l.Settings)
	if errors.Is(err, pgx.ErrNoRows) {
		return l, false, nil
	}
	if err != nil {
		return l, false, fmt.Errorf("read the leader of slot %q: %w", slot, err)
	}
	return l, true, nil
}

// LeaderState is a slot's leader as the target shows it: its row (Leader), whether a session holds
// the slot's leader lock now (Alive), whether a daemon of the slot runs now (Running: Alive, or a
// session holds its running lock, MarkRunning), and how many standbys wait for it (MarkStandby).
type LeaderState struct {
	Leader
	Alive, Running bool
	Standbys       int
}

// ReadLeaders returns the leader state of every slot that ever had a leader, by slot; an empty
// map when the target's schema predates leaders (version 11).
func ReadLeaders(ctx context.Context, conn *pgx.Conn) (map[string]LeaderState, error) {
	leader, standby, running := advisory.Leader("l.slot").Is("k"), advisory.Standby("l.slot").Is("k"), advisory.Running("l.slot").Is("k")
	rows, err := conn.Query(ctx, `select l.slot, l.epoch, l.holder, l.acquired_at::text,
  count(k.*) filter (where `+leader+`) > 0,
  count(k.*) filter (where `+leader+` or `+running+`) > 0,
  count(k.*) filter (where `+standby+`)
from pgconverge.leaders l left join pg_locks k on k.granted and (`+leader+` or `+standby+` or `+running+`)
group by l.slot, l.epoch, l.holder, l.acquired_at`)
	if err != nil {
		if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UndefinedTable {
			return map[string]LeaderState{}, nil
		}
		return nil, fmt.Errorf("read the slots' leaders: %w", err)
	}
	out := map[string]LeaderState{}
	var slot string
	var st LeaderState
	_, err = pgx.ForEachRow(rows, []any{&slot, &st.Epoch, &st.Holder, &st.AcquiredAt, &st.Alive, &st.Running, &st.Standbys}, func() error {
		out[slot] = st
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the slots' leaders: %w", err)
	}
	return out, nil
}

// LeaderLockHolder returns the target process that holds slot's leader lock, and how long
// (seconds) its session has been idle since its last statement (pg_stat_activity.state_change;
// 0 while a statement runs, such as the epoch raise waiting for the old leader): a leader checks
// its lock every few seconds, so a long silence means a frozen process or a broken network. pid
// is 0 when nobody holds the lock; silent is -1 when the session's activity is hidden from this
// role (another role without pg_read_all_stats).
func LeaderLockHolder(ctx context.Context, conn *pgx.Conn, slot string) (pid int32, silent float64, err error) {
	err = conn.QueryRow(ctx, `select l.pid, case when a.state = 'active' then 0
  else coalesce(extract(epoch from now() - a.state_change)::float8, -1) end
from pg_locks l left join pg_stat_activity a on a.pid = l.pid
where l.granted and `+advisory.Leader("$1").Is("l"), slot).Scan(&pid, &silent)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, -1, nil
	}
	if err != nil {
		return 0, -1, fmt.Errorf("look up the holder of slot %q's leader lock: %w", slot, err)
	}
	return pid, silent, nil
}

// Lead raises slot's epoch and records holder as its leader, with the settings every daemon of
// the slot must share; the caller holds the leader lock (LockLeader). It waits for the sessions
// that hold the previous epoch (HoldEpoch), then for the transactions that locked the row under
// it (CheckLeaderTx), and returns the new epoch, 1 for a slot never led before.
func Lead(ctx context.Context, conn *pgx.Conn, slot, holder, settings string) (int64, error) {
	var epoch int64
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `select `+advisory.Epoch("$1").XactLock(), slot); err != nil {
			return err
		}
		// clock_timestamp: the moment the raise got the row, after the previous leader's transactions.
		return tx.QueryRow(ctx, `insert into pgconverge.leaders as l (slot, epoch, holder, settings, acquired_at) values ($1, 1, $2, $3, clock_timestamp())
on conflict (slot) do update set epoch = l.epoch + 1, holder = excluded.holder, settings = excluded.settings, acquired_at = clock_timestamp()
returning epoch`, slot, holder, settings).Scan(&epoch)
	})
	if err != nil {
		return 0, fmt.Errorf("record the new leader of slot %q: %w", slot, err)
	}
	return epoch, nil
}

// FencedError is a write refused because another daemon became the slot's leader since this one
// did: this daemon lost the leader lock (its lock connection ended) and must stop writing.
type FencedError struct {
	Slot string
	// Epoch is this daemon's; Current and Holder the slot's leader now (Current is 0 when it is
	// not known yet: the row is gone, or a new leader's raise waits).
	Epoch, Current int64
	Holder         string
}

// Mark says that the daemon restarts the session at once (reason "leadership"): the next one
// waits as a standby.
func (e *FencedError) Mark() disposition.Mark {
	return disposition.Mark{Action: disposition.Restart, Reason: disposition.ReasonLeadership}
}

// Error names the slot, both epochs and the new leader.
func (e *FencedError) Error() string {
	since := ""
	if e.Current != 0 {
		since = fmt.Sprintf(" since epoch %d", e.Current)
	}
	return fmt.Sprintf("slot %q is led by %s%s, after this daemon's epoch %d: this daemon lost its leader lock (its lock connection to the target ended) and writes nothing more; it waits as a standby",
		e.Slot, e.Holder, since, e.Epoch)
}

// leaderSQL locks slot $1's leader row against a new leader's Lead until the transaction ends.
const leaderSQL = `select epoch, holder from pgconverge.leaders where slot = $1 for share`

// CheckLeaderTx fails with a *FencedError unless epoch is still slot's epoch, and holds the row
// so that no new leader raises it before tx ends: whatever tx commits, it commits as the leader.
func CheckLeaderTx(ctx context.Context, tx pgx.Tx, slot string, epoch int64) error {
	return checkLeader(tx.QueryRow(ctx, leaderSQL, slot), slot, epoch)
}

// checkLeader reads leaderSQL's row and compares its epoch with epoch.
func checkLeader(row pgx.Row, slot string, epoch int64) error {
	var current int64
	var holder string
	err := row.Scan(&current, &holder)
	if errors.Is(err, pgx.ErrNoRows) {
		return &FencedError{Slot: slot, Epoch: epoch, Holder: "no daemon (the leader row is gone)"}
	}
	if err != nil {
		return fmt.Errorf("check the leader of slot %q: %w", slot, err)
	}
	if current != epoch {
		return &FencedError{Slot: slot, Epoch: epoch, Current: current, Holder: holder}
	}
	return nil
}
