package cdc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// Decoding from a standby (PostgreSQL 16 and later, PostgreSQL docs §47.2.3 "Replication Slots",
// "logical decoding on standby"): a hot standby keeps logical slots of its own and decodes the WAL
// it replays, which is byte for byte the primary's, so LSNs, snapshots and coverage mean the same
// on both servers. What it cannot do is write: a publication is created on the primary and
// reaches the standby by replay, and a slot's creation waits for a running-transactions record
// (xl_running_xacts) from the primary, which the primary logs every 15 s while it writes and on
// demand with pg_log_standby_snapshot().

// MinStandbyDecodingVersion is the first major version of PostgreSQL that decodes on a standby.
const MinStandbyDecodingVersion = 16

// positionSQL is the SQL expression of the source's current position for primaryExpr, a function
// of the primary's WAL positions that fails in recovery: on a standby it is the position the
// standby has replayed up to (pg_last_wal_replay_lsn()), which is as far as a slot on it decodes.
func positionSQL(primaryExpr string) string {
	return "case when pg_is_in_recovery() then pg_last_wal_replay_lsn() else " + primaryExpr + " end"
}

// InRecovery reports whether the server conn is connected to is a standby in recovery
// (pg_is_in_recovery()).
func InRecovery(ctx context.Context, conn *pgx.Conn) (bool, error) {
	var r bool
	if err := conn.QueryRow(ctx, `select pg_is_in_recovery()`).Scan(&r); err != nil {
		return false, fmt.Errorf("read whether the source is in recovery: %w", err)
	}
	return r, nil
}

// checkStandby returns the reasons the standby in recovery conn is connected to cannot decode:
// a server before PostgreSQL 16, or hot_standby_feedback off (without it the primary's VACUUM
// removes catalog rows the standby's slots still need, and the standby invalidates them,
// invalidation reason rows_removed).
func checkStandby(ctx context.Context, conn *pgx.Conn) []error {
	c := conn.Config()
	if v := pgsession.MajorVersion(conn.PgConn()); v < MinStandbyDecodingVersion {
		return []error{fmt.Errorf("the source at %s:%d is a standby in recovery (pg_is_in_recovery() is true) of PostgreSQL %d: decoding from a standby needs PostgreSQL %d or later: point --source at the primary",
			c.Host, c.Port, v, MinStandbyDecodingVersion)}
	}
	var feedback string
	if err := conn.QueryRow(ctx, `select current_setting('hot_standby_feedback')`).Scan(&feedback); err != nil {
		return []error{fmt.Errorf("read the standby's hot_standby_feedback: %w", err)}
	}
	if feedback != "on" {
		return []error{fmt.Errorf("the source at %s:%d is a standby with hot_standby_feedback off: the primary's VACUUM would remove catalog rows its replication slot needs and the standby would invalidate the slot; run ALTER SYSTEM SET hot_standby_feedback = on and SELECT pg_reload_conf() on the standby (and stream it from the primary through a physical slot, primary_slot_name)",
			c.Host, c.Port)}
	}
	return nil
}

// CheckPrimary reports every reason the server primary is connected to cannot serve as the
// primary of the standby source (--primary): it is in recovery itself, it is another cluster
// (pg_control_system's system identifier differs) or another database, its wal_level is not
// logical (a standby decodes only WAL written at wal_level logical), or the role may not call
// pg_log_standby_snapshot() (superusers only unless granted EXECUTE).
func CheckPrimary(ctx context.Context, primary, source *pgx.Conn) error {
	var primaryID, sourceID, walLevel string
	var recovery, canLog bool
	err := primary.QueryRow(ctx, `select (select system_identifier::text from pg_control_system()) || '/' || current_database(),
  current_setting('wal_level'), pg_is_in_recovery(), has_function_privilege('pg_log_standby_snapshot()', 'execute')`).
		Scan(&primaryID, &walLevel, &recovery, &canLog)
	if err != nil {
		return fmt.Errorf("read the primary's settings (--primary): %w", err)
	}
	if sourceID, err = SourceID(ctx, source); err != nil {
		return err
	}
	c := primary.Config()
	var errs []error
	if recovery {
		errs = append(errs, fmt.Errorf("--primary at %s:%d is in recovery too: name the primary the standby --source streams from (its primary_conninfo)", c.Host, c.Port))
	}
	if primaryID != sourceID {
		errs = append(errs, fmt.Errorf("--primary at %s:%d is cluster and database %s, the standby --source is %s: name the primary of that standby, and the same database", c.Host, c.Port, primaryID, sourceID))
	}
	if walLevel != "logical" {
		errs = append(errs, fmt.Errorf("the primary's wal_level is %q: a standby decodes only WAL written at wal_level logical: run ALTER SYSTEM SET wal_level = logical on the primary and restart it", walLevel))
	}
	if !canLog {
		errs = append(errs, fmt.Errorf("the --primary role %q may not call pg_log_standby_snapshot(), which makes a slot's creation on the standby quick: run GRANT EXECUTE ON FUNCTION pg_log_standby_snapshot() TO %s on the primary",
			c.User, pgx.Identifier{c.User}.Sanitize()))
	}
	return errors.Join(errs...)
}

// WaitReplayed waits until the standby conn is connected to has replayed the primary's WAL up to
// lsn (pg_last_wal_replay_lsn()), so that what the primary committed before lsn (a publication's
// change, say) is in the standby's catalogs. It polls every 20 ms; it fails after timeout, naming
// the positions.
func WaitReplayed(ctx context.Context, conn *pgx.Conn, lsn pglogrepl.LSN, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		var replayed string
		if err := conn.QueryRow(ctx, `select coalesce(pg_last_wal_replay_lsn(), '0/0')::text`).Scan(&replayed); err != nil {
			return fmt.Errorf("read the standby's replay position: %w", err)
		}
		at, err := pglogrepl.ParseLSN(replayed)
		if err != nil {
			return err
		}
		if at >= lsn {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the standby replayed the primary's WAL only up to %s within %s, not up to %s: check that it streams from the primary (pg_stat_wal_receiver)", at, timeout, lsn)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// NoPrimaryWarning is logged at WARN when the source is a standby and --primary is not set.
const NoPrimaryWarning = "the source is a standby and --primary is not set: the publication must exist on the primary with every selected table, and each replication slot created on the standby (the daemon's, and one per backfill or verify) waits for the primary to log a running-transactions record, every 15 s while it writes and never while it is idle: pass --primary, or run SELECT pg_log_standby_snapshot() on the primary while pgconverge waits"

// CheckStandbyPrimary, when the source over src is a standby in recovery, runs CheckPrimary on a
// connection of its own to primaryURL (--primary of a command that only reads snapshots: backfill,
// verify), or logs NoPrimaryWarning on log when primaryURL is ""; on a primary it does nothing.
func CheckStandbyPrimary(ctx context.Context, src *pgx.Conn, primaryURL string, log *slog.Logger) error {
	standby, err := InRecovery(ctx, src)
	if err != nil || !standby {
		return err
	}
	if primaryURL == "" {
		log.Warn(NoPrimaryWarning)
		return nil
	}
	primary, err := pgsession.Connect(ctx, primaryURL, "primary")
	if err != nil {
		return err
	}
	defer primary.Close(context.WithoutCancel(ctx))
	return CheckPrimary(ctx, primary, src)
}
