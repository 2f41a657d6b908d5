package operator

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// readFailover returns the failover readiness of slot (coverage.FailoverReadiness) as the source
// src shows it (the slot's failover column, synchronized_standby_slots, the physical slots), and
// as each standby URL of standbys shows it (its docs §29.3 readiness query); nil for a source
// older than PostgreSQL 17, which has no failover slots, and for a missing slot. A standby that
// cannot be reached or read is reported with its error, not returned as one.
func readFailover(ctx context.Context, src *pgx.Conn, slot string, standbys []string) (*coverage.FailoverReadiness, error) {
	if pgsession.MajorVersion(src.PgConn()) < 17 {
		return nil, nil
	}
	r := &coverage.FailoverReadiness{PhysicalSlots: []coverage.PhysicalSlot{}}
	err := src.QueryRow(ctx, `select failover from pg_replication_slots where slot_name = $1 and database = current_database()`, slot).Scan(&r.Enabled)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the failover property of slot %q: %w", slot, err)
	}
	rows, err := src.Query(ctx, `select slot_name::text, active, xmin is not null or catalog_xmin is not null, restart_lsn::text
from pg_replication_slots where slot_type = 'physical' order by slot_name`)
	if err != nil {
		return nil, fmt.Errorf("read the source's physical slots: %w", err)
	}
	for rows.Next() {
		var p coverage.PhysicalSlot
		var restart *string
		if err := rows.Scan(&p.Name, &p.Active, &p.Feedback, &restart); err != nil {
			return nil, fmt.Errorf("read the source's physical slots: %w", err)
		}
		if p.RestartLSN, err = optionalLSN(restart); err != nil {
			return nil, err
		}
		r.PhysicalSlots = append(r.PhysicalSlots, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the source's physical slots: %w", err)
	}
	var setting string
	if err := src.QueryRow(ctx, `select current_setting('synchronized_standby_slots')`).Scan(&setting); err != nil {
		return nil, fmt.Errorf("read synchronized_standby_slots: %w", err)
	}
	r.Synchronized(setting)
	for _, url := range standbys {
		r.StandbyChecks = append(r.StandbyChecks, checkStandby(ctx, url, slot))
	}
	r.Assess(slot)
	return r, nil
}

// checkStandby runs the readiness query of PostgreSQL 17 docs §29.3 for slot on the standby at
// url.
func checkStandby(ctx context.Context, url, slot string) coverage.StandbyCheck {
	c := coverage.StandbyCheck{Standby: url}
	if cfg, err := pgx.ParseConfig(url); err == nil {
		c.Standby = fmt.Sprintf("%s:%d/%s", cfg.Host, cfg.Port, cfg.Database)
	}
	conn, err := pgsession.Connect(ctx, url, "standby")
	if err != nil {
		c.Error = err.Error()
		return c
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if v := pgsession.MajorVersion(conn.PgConn()); v < 17 {
		c.Error = fmt.Sprintf("it runs PostgreSQL %d: only 17 and later keep copies of failover slots", v)
		return c
	}
	var flush, reason *string
	err = conn.QueryRow(ctx, `select pg_is_in_recovery(), current_setting('sync_replication_slots')::bool,
  current_setting('hot_standby_feedback')::bool, s.slot_name is not null,
  coalesce(s.synced, false), coalesce(s.temporary, false), s.invalidation_reason::text, s.confirmed_flush_lsn::text,
  coalesce(s.synced and not s.temporary and s.invalidation_reason is null, false)
from (select 1) one left join pg_replication_slots s on s.slot_name = $1`, slot).Scan(&c.InRecovery, &c.SyncReplicationSlots, &c.HotStandbyFeedback, &c.Exists,
		&c.Synced, &c.Temporary, &reason, &flush, &c.Ready)
	if err != nil {
		c.Error = fmt.Sprintf("read pg_replication_slots: %v", err)
		return c
	}
	if reason != nil {
		c.InvalidationReason = *reason
	}
	if c.ConfirmedFlushLSN, err = optionalLSN(flush); err != nil {
		c.Error = err.Error()
	}
	c.Ready = c.Ready && c.InRecovery
	return c
}

// optionalLSN parses an LSN's text, nil for a NULL.
func optionalLSN(text *string) (*coverage.LSN, error) {
	if text == nil {
		return nil, nil
	}
	l, err := pglogrepl.ParseLSN(*text)
	if err != nil {
		return nil, err
	}
	v := coverage.LSN(l)
	return &v, nil
}
