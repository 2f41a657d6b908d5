package cdc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/internal/disposition"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// SlotInfo is what the source says of a replication slot (pg_replication_slots).
type SlotInfo struct {
	Exists   bool
	Plugin   string
	Database string
	// ThisDatabase is true for a slot of the database conn is connected to (current_database()),
	// or of none (a physical slot).
	ThisDatabase bool
	// ConfirmedFlush is the position up to which the consumer confirmed it holds every change.
	ConfirmedFlush pglogrepl.LSN
	// WALStatus is reserved, extended, unreserved or lost (PostgreSQL docs, pg_replication_slots).
	WALStatus string
	// ActivePID is the pid of the walsender using the slot, or 0.
	ActivePID int32
	// RestartLSN is the oldest WAL position the slot keeps, 0 when it keeps none (lost).
	RestartLSN pglogrepl.LSN
	// SafeWALSize is how many bytes of WAL may still be written before the slot is at risk of
	// being invalidated (safe_wal_size); nil when max_slot_wal_keep_size is -1 or the slot is lost.
	SafeWALSize *int64
	// InvalidationReason is why the source invalidated the slot, "" while it is valid: PostgreSQL
	// 17 and later say it (invalidation_reason: wal_removed, rows_removed,
	// wal_level_insufficient, and from 18 idle_timeout); 16 says only that a conflict with
	// recovery invalidated it ("conflicting"); before, wal_status lost is the only sign.
	InvalidationReason string
	// Failover is true for a failover slot, which standbys with sync_replication_slots keep a
	// copy of (pg_replication_slots.failover, PostgreSQL 17 and later; false before).
	Failover bool
}

// ReadSlot returns what the source says of slot name; Exists is false when there is none.
func ReadSlot(ctx context.Context, conn *pgx.Conn, name string) (SlotInfo, error) {
	var s SlotInfo
	var flush, restart *string
	var plugin, db, status *string
	var pid *int32
	var invalidation *string
	err := conn.QueryRow(ctx, `select plugin::text, database::text, confirmed_flush_lsn::text, wal_status, active_pid,
  restart_lsn::text, safe_wal_size, database is null or database = current_database(), `+invalidationReason(conn)+`, `+failoverColumn(conn)+`
from pg_replication_slots where slot_name = $1`, name).Scan(&plugin, &db, &flush, &status, &pid, &restart, &s.SafeWALSize, &s.ThisDatabase, &invalidation, &s.Failover)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, nil
	}
	if err != nil {
		return s, fmt.Errorf("read replication slot %q: %w", name, err)
	}
	s.Exists = true
	s.Plugin, s.Database, s.WALStatus, s.InvalidationReason = deref(plugin), deref(db), deref(status), deref(invalidation)
	if pid != nil {
		s.ActivePID = *pid
	}
	for _, l := range []struct {
		text *string
		lsn  *pglogrepl.LSN
	}{{flush, &s.ConfirmedFlush}, {restart, &s.RestartLSN}} {
		if l.text == nil {
			continue
		}
		if *l.lsn, err = pglogrepl.ParseLSN(*l.text); err != nil {
			return s, fmt.Errorf("read replication slot %q: %w", name, err)
		}
	}
	return s, nil
}

// invalidationReason is the pg_replication_slots expression of a slot's invalidation reason on
// conn's server (SlotInfo.InvalidationReason), null while the slot is valid.
func invalidationReason(conn *pgx.Conn) string {
	switch v := pgsession.MajorVersion(conn.PgConn()); {
	case v >= 17:
		return `invalidation_reason::text`
	case v == 16:
		// 16 sets conflicting for any invalidation, a removal of WAL (wal_status lost) too.
		return `case when conflicting and wal_status is distinct from 'lost' then 'conflicting' end`
	}
	return `null::text`
}

// failoverColumn is the pg_replication_slots expression of a slot's failover property on conn's
// server (SlotInfo.Failover): false before PostgreSQL 17, which has no failover slots.
func failoverColumn(conn *pgx.Conn) string {
	if pgsession.MajorVersion(conn.PgConn()) >= 17 {
		return `failover`
	}
	return `false`
}

// MaxSlotWALKeepSize returns the source's max_slot_wal_keep_size in bytes, -1 for unlimited
// (PostgreSQL docs §20.6.1).
func MaxSlotWALKeepSize(ctx context.Context, conn *pgx.Conn) (int64, error) {
	var n int64
	if err := conn.QueryRow(ctx, `select pg_size_bytes(current_setting('max_slot_wal_keep_size'))`).Scan(&n); err != nil {
		return 0, fmt.Errorf("read max_slot_wal_keep_size: %w", err)
	}
	return n, nil
}

// ErrSlotMissing is wrapped by errors of starting replication on, or dropping, a slot that does not
// exist (it was dropped meanwhile): the next session records the gap and creates it anew. The
// daemon backs off; the SQLSTATE beside it, if any, names the reason.
var ErrSlotMissing = disposition.New("replication slot missing", disposition.Mark{Action: disposition.BackOff})

// ErrPublicationMissing is wrapped by the error of a stream the source ended because the
// publication does not exist at the position it decodes: it was dropped (and maybe created again)
// while the slot still needed it, and PostgreSQL cannot decode past that point.
var ErrPublicationMissing = errors.New("publication missing")

// ErrSlotBusy is returned by Busy when another session holds the slot or is still creating it;
// waiting and retrying is the remedy (the daemon backs off, reason "slot-busy").
var ErrSlotBusy = disposition.New("replication slot busy", disposition.Mark{Action: disposition.BackOff, Reason: disposition.ReasonSlotBusy})

// Busy returns an error wrapping ErrSlotBusy when another process uses the slot or is still
// creating it (no confirmed_flush_lsn yet), and nil otherwise.
func (s SlotInfo) Busy(name string) error {
	switch {
	case s.ActivePID != 0:
		return fmt.Errorf("%w: slot %q is in use by source process %d (another pgconverge with the same --slot, or the walsender of a killed one that the source has not noticed yet)", ErrSlotBusy, name, s.ActivePID)
	case s.ConfirmedFlush == 0:
		return fmt.Errorf("%w: slot %q is still being created by another session", ErrSlotBusy, name)
	}
	return nil
}

// TakeSlot ends the walsender that streams slot name to another client, the way a new leader
// takes the slot from a daemon that lost its leadership (whose walsender the source may not
// notice for wal_sender_timeout when the network, not the process, failed): it terminates the
// slot's active process when it is a walsender (pg_terminate_backend, PostgreSQL docs §9.27.2;
// the role needs to be the walsender's role, or a member of pg_signal_backend), and waits up to
// timeout for the slot to be free. A session that only peeks at the slot (a regular backend) is
// left alone. It returns the process it ended, 0 for none.
func TakeSlot(ctx context.Context, conn *pgx.Conn, name string, timeout time.Duration) (int32, error) {
	var pid *int32
	err := conn.QueryRow(ctx, `select s.active_pid from pg_replication_slots s join pg_stat_activity a on a.pid = s.active_pid
where s.slot_name = $1 and a.backend_type = 'walsender'`, name).Scan(&pid)
	if errors.Is(err, pgx.ErrNoRows) || err == nil && pid == nil {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("look up the walsender of slot %q: %w", name, err)
	}
	if _, err := conn.Exec(ctx, `select pg_terminate_backend($1)`, *pid); err != nil {
		return 0, fmt.Errorf("end walsender %d of slot %q (the source role needs to be the walsender's role or a member of pg_signal_backend): %w", *pid, name, err)
	}
	deadline := time.Now().Add(timeout)
	for {
		var active bool
		if err := conn.QueryRow(ctx, `select coalesce((select active_pid = $2 from pg_replication_slots where slot_name = $1), false)`, name, *pid).Scan(&active); err != nil {
			return 0, fmt.Errorf("look up slot %q: %w", name, err)
		}
		if !active {
			return *pid, nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%w: walsender %d of slot %q did not end within %s of pg_terminate_backend", ErrSlotBusy, *pid, name, timeout)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Usable returns an error naming the problem and the fix when the existing slot cannot be streamed
// from database db: another plugin, another database. A slot whose WAL was removed (Lost) is
// usable by no one; the daemon replaces it.
func (s SlotInfo) Usable(name, db string) error {
	switch {
	case s.Plugin != "pgoutput":
		return fmt.Errorf("replication slot %q uses plugin %q, not pgoutput: choose another --slot or drop it with SELECT pg_drop_replication_slot('%s')", name, s.Plugin, name)
	case s.Database != db:
		return fmt.Errorf("replication slot %q belongs to database %q, not %q: choose another --slot", name, s.Database, db)
	}
	return nil
}

// CurrentLSN returns the source's current WAL position: on a primary its insert position
// (pg_current_wal_insert_lsn()), at or after every record inserted so far, commits not yet written
// under synchronous_commit = off included, which pg_current_wal_lsn() (the write position) can
// miss; on a standby in recovery the position it has replayed up to (pg_last_wal_replay_lsn(),
// positionSQL), which is all a slot on it can decode.
func CurrentLSN(ctx context.Context, conn *pgx.Conn) (pglogrepl.LSN, error) {
	var v string
	if err := conn.QueryRow(ctx, "select "+positionSQL("pg_current_wal_insert_lsn()")+"::text").Scan(&v); err != nil {
		return 0, fmt.Errorf("read the source's current WAL position: %w", err)
	}
	return pglogrepl.ParseLSN(v)
}

// CurrentPositions returns the source's current WAL insert position (as CurrentLSN) and its flush
// position (pg_current_wal_flush_lsn()), read in one statement: every commit before the flush
// position is durable, and visible unless it still waits for a synchronous standby. On a standby
// in recovery both are its replay position.
func CurrentPositions(ctx context.Context, conn *pgx.Conn) (insert, flushed pglogrepl.LSN, err error) {
	var i, f string
	if err := conn.QueryRow(ctx, "select "+positionSQL("pg_current_wal_insert_lsn()")+"::text, "+positionSQL("pg_current_wal_flush_lsn()")+"::text").Scan(&i, &f); err != nil {
		return 0, 0, fmt.Errorf("read the source's current WAL positions: %w", err)
	}
	if insert, err = pglogrepl.ParseLSN(i); err != nil {
		return 0, 0, err
	}
	flushed, err = pglogrepl.ParseLSN(f)
	return insert, flushed, err
}

// SourceID identifies the database conn is connected to across restarts and host names: the
// cluster's system identifier (pg_control_system()) and the database name, "ID/NAME".
func SourceID(ctx context.Context, conn *pgx.Conn) (string, error) {
	var id string
	err := conn.QueryRow(ctx, `select system_identifier::text || '/' || current_database() from pg_control_system()`).Scan(&id)
	if err != nil {
		return "", fmt.Errorf("identify the source database: %w", err)
	}
	return id, nil
}

// Lost reports whether the source invalidated the slot, so that it can no longer stream: it
// removed WAL the slot still needed (wal_status lost, PostgreSQL docs §54.19 pg_replication_slots;
// see max_slot_wal_keep_size), or, from PostgreSQL 16 on, for any other InvalidationReason (rows
// the slot needed were removed, wal_level lowered, the slot idle past idle_replication_slot_timeout).
func (s SlotInfo) Lost() bool { return s.WALStatus == "lost" || s.InvalidationReason != "" }

// LostBecause says why the slot is lost, for logs and errors: "wal_status lost" (with the
// reason) or the source's invalidation reason.
func (s SlotInfo) LostBecause() string {
	if s.InvalidationReason != "" && s.InvalidationReason != "wal_removed" {
		return "invalidation_reason " + s.InvalidationReason + ", wal_status " + s.WALStatus
	}
	return "wal_status lost: the source removed WAL it still needed (max_slot_wal_keep_size)"
}

// DropSlot drops replication slot name on the source (pg_drop_replication_slot); the slot must be
// inactive.
func DropSlot(ctx context.Context, conn *pgx.Conn, name string) error {
	if _, err := conn.Exec(ctx, `select pg_drop_replication_slot($1)`, name); err != nil {
		if pgsession.IsCode(err, pgerrcode.UndefinedObject) {
			return fmt.Errorf("drop replication slot %q: %w: %w", name, ErrSlotMissing, err)
		}
		return fmt.Errorf("drop replication slot %q: %w", name, err)
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// PendingTransactions counts the transactions that slot would stream to publication's consumer
// after position after: those whose commit LSN (the final LSN of pgoutput's Begin message,
// PostgreSQL docs §55.9 "Logical Replication Message Formats") is past it. PostgreSQL 15's
// pgoutput sends no Begin for a transaction without a published change, so each counted one
// changes a published table. It decodes without consuming (pg_logical_slot_peek_binary_changes,
// docs §9.27.6), which needs the slot free: an active one is an error wrapping ErrSlotBusy.
func PendingTransactions(ctx context.Context, conn *pgx.Conn, slot, publication string, after pglogrepl.LSN) (int64, error) {
	var n int64
	err := conn.QueryRow(ctx, `select count(*) from pg_logical_slot_peek_binary_changes($1, null, null,
  'proto_version', '1', 'publication_names', $2) c
where get_byte(c.data, 0) = 66 and ('x' || encode(substring(c.data from 2 for 8), 'hex'))::bit(64)::bigint > $3`,
		slot, publication, int64(after)).Scan(&n)
	if pgsession.IsCode(err, pgerrcode.ObjectInUse) {
		return 0, fmt.Errorf("peek at slot %q: %w: %w", slot, ErrSlotBusy, err)
	}
	if err != nil {
		return 0, fmt.Errorf("peek at slot %q: %w", slot, err)
	}
	return n, nil
}

// WaitWALFlushed waits until the source over conn has flushed its WAL up to the position it had
// inserted when called (pg_current_wal_insert_lsn): logical decoding, and so a slot's peek, reads
// only flushed WAL, and a transaction committed with synchronous_commit off is flushed by the WAL
// writer within wal_writer_delay (PostgreSQL docs §30.4, "Asynchronous Commit"). On a standby in
// recovery, whose slots decode what it replayed, it returns at once. It polls every 10 ms and
// fails after timeout.
func WaitWALFlushed(ctx context.Context, conn *pgx.Conn, timeout time.Duration) error {
	var inserted string
	if err := conn.QueryRow(ctx, "select "+positionSQL("pg_current_wal_insert_lsn()")+"::text").Scan(&inserted); err != nil {
		return fmt.Errorf("read the source's WAL insert position: %w", err)
	}
	deadline := time.Now().Add(timeout)
	for {
		var flushed bool
		if err := conn.QueryRow(ctx, "select "+positionSQL("pg_current_wal_flush_lsn()")+" >= $1::pg_lsn", inserted).Scan(&flushed); err != nil {
			return fmt.Errorf("read the source's WAL flush position: %w", err)
		}
		if flushed {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the source did not flush its WAL up to %s within %s", inserted, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}
