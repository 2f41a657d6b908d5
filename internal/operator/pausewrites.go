package operator

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// writePrivileges are the table privileges a write pause revokes.
var writePrivileges = []string{"INSERT", "UPDATE", "DELETE", "TRUNCATE"}

// writePause is the application's writes paused on the source for a switchover (cutover
// --pause-writes): the role's write privileges on the publication's tables (and their
// partitions) revoked, recorded in the target's pgconverge.write_pauses first, so that a cutover
// that fails, or a later run after a kill, gives back exactly what was taken.
type writePause struct {
	role string
	at   time.Time
}

// pauseWrites revokes role's INSERT, UPDATE, DELETE and TRUNCATE on the tables of publication
// (and their partitions) on the source's writable server (writer), in one transaction that
// first checks the role can no longer write any of them (has_table_privilege: a superuser, or a
// privilege held through another role or PUBLIC, cannot be taken this way, and nothing is
// revoked then). What it revokes is recorded on tgt before. A pause an earlier run left open for
// the same slot and role is taken over (its privileges revoked again), one for another role is
// given back first. It then waits (up to 30 s) for the role's transactions that were writing to
// end: their commits are part of what the cutover catches up to.
func pauseWrites(ctx context.Context, cfg CutoverConfig, src, tgt *pgx.Conn) (*writePause, error) {
	rc, role := cfg.Run, cfg.PauseWrites
	w, done, err := writer(ctx, src, rc.Primary)
	if err != nil {
		return nil, err
	}
	defer done()
	open, err := openPause(ctx, tgt, rc.Slot)
	if err != nil {
		return nil, err
	}
	if open != nil && open.role != role {
		rc.Logger.Warn("cutover: an earlier cutover paused another role's writes and did not end: giving them back first", "role", open.role)
		if _, err := giveBackWrites(ctx, w, tgt, rc.Slot, rc.Logger.Info); err != nil {
			return nil, err
		}
		open = nil
	}
	tables, err := publishedTables(ctx, w, rc.Publication)
	if err != nil {
		return nil, err
	}
	if open == nil {
		if err := recordPause(ctx, w, tgt, rc.Slot, role, tables); err != nil {
			return nil, err
		}
	}
	err = pgx.BeginFunc(ctx, w, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "revoke "+strings.Join(writePrivileges, ", ")+" on table "+strings.Join(tables, ", ")+" from "+pgx.Identifier{role}.Sanitize()); err != nil {
			return fmt.Errorf("revoke the writes of role %s on the source (the cutover's source role must own the tables, or be a superuser): %w", role, err)
		}
		var still []string
		err := tx.QueryRow(ctx, `select coalesce(array_agg(t), '{}') from unnest($2::text[]) t
where has_table_privilege($1, t, 'INSERT, UPDATE, DELETE, TRUNCATE')`, role, tables).Scan(&still)
		if err != nil {
			return fmt.Errorf("check the writes of role %s: %w", role, err)
		}
		if len(still) > 0 {
			return fmt.Errorf("role %s can still write %s after the REVOKE: it is a superuser or owns them through another role, or holds the privileges through a role it belongs to or PUBLIC, or another grantor granted them; pause its writes otherwise (or name the role that holds them), then run cutover again (nothing was revoked or cut over)",
				role, strings.Join(still, ", "))
		}
		return nil
	})
	if err != nil {
		if open == nil {
			_, derr := tgt.Exec(context.WithoutCancel(ctx), `delete from pgconverge.write_pauses where slot = $1`, rc.Slot)
			err = errors.Join(err, derr)
		}
		return nil, err
	}
	p := &writePause{role: role}
	if err := tgt.QueryRow(ctx, `select paused_at from pgconverge.write_pauses where slot = $1`, rc.Slot).Scan(&p.at); err != nil {
		return nil, fmt.Errorf("read the write pause: %w", err)
	}
	rc.Logger.Info("cutover: the application's writes are paused: role's write privileges revoked on the source", "role", role, "tables", len(tables))
	return p, waitWriters(ctx, w, role, rc.Logger.Info)
}

// openPause returns the write pause of slot that has not ended, or nil.
func openPause(ctx context.Context, tgt *pgx.Conn, slot string) (*writePause, error) {
	p := &writePause{}
	err := tgt.QueryRow(ctx, `select role_name, paused_at from pgconverge.write_pauses where slot = $1 and outcome is null`, slot).Scan(&p.role, &p.at)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the write pause of slot %q: %w", slot, err)
	}
	return p, nil
}

// publishedTables returns the tables of publication and their partitions, schema-qualified and
// quoted, by name.
func publishedTables(ctx context.Context, w *pgx.Conn, publication string) ([]string, error) {
	rows, err := w.Query(ctx, `with published as (
  select format('%I.%I', schemaname, tablename)::regclass as rel from pg_publication_tables where pubname = $1)
select distinct format('%I.%I', n.nspname, c.relname) from (
  select rel from published union select tree.relid from published, pg_partition_tree(rel) tree) t
join pg_class c on c.oid = t.rel join pg_namespace n on n.oid = c.relnamespace order by 1`, publication)
	if err != nil {
		return nil, fmt.Errorf("list the tables of publication %q: %w", publication, err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list the tables of publication %q: %w", publication, err)
	}
	if len(tables) == 0 {
		return nil, fmt.Errorf("publication %q has no tables on the source: no writes to pause", publication)
	}
	return tables, nil
}

// recordPause records on tgt the pause of role's writes for slot and the privileges role holds
// itself on tables, which giveBackWrites grants again.
func recordPause(ctx context.Context, w, tgt *pgx.Conn, slot, role string, tables []string) error {
	var super bool
	if err := w.QueryRow(ctx, `select rolsuper from pg_roles where rolname = $1`, role).Scan(&super); errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("--pause-writes %s: no such role on the source (the role the application writes as)", role)
	} else if err != nil {
		return fmt.Errorf("read role %s on the source: %w", role, err)
	}
	if super {
		return fmt.Errorf("--pause-writes %s: the role is a superuser, whose writes no privilege stops; give the application a role of its own", role)
	}
	rows, err := w.Query(ctx, `select t, a.privilege_type, a.is_grantable from unnest($2::text[]) t
join pg_class c on c.oid = t::regclass
cross join lateral aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a
where a.grantee = (select oid from pg_roles where rolname = $1) and a.privilege_type = any($3)`, role, tables, writePrivileges)
	if err != nil {
		return fmt.Errorf("read the privileges of role %s on the source: %w", role, err)
	}
	type grant struct {
		table, privilege string
		grantable        bool
	}
	grants, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (grant, error) {
		var g grant
		err := r.Scan(&g.table, &g.privilege, &g.grantable)
		return g, err
	})
	if err != nil {
		return fmt.Errorf("read the privileges of role %s on the source: %w", role, err)
	}
	return pgx.BeginFunc(ctx, tgt, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `delete from pgconverge.write_pauses where slot = $1`, slot); err != nil {
			return fmt.Errorf("record the write pause: %w", err)
		}
		if _, err := tx.Exec(ctx, `insert into pgconverge.write_pauses (slot, role_name) values ($1, $2)`, slot, role); err != nil {
			return fmt.Errorf("record the write pause: %w", err)
		}
		for _, g := range grants {
			if _, err := tx.Exec(ctx, `insert into pgconverge.write_pause_grants (slot, table_name, privilege, grantable) values ($1, $2, $3, $4)`,
				slot, g.table, g.privilege, g.grantable); err != nil {
				return fmt.Errorf("record the write pause: %w", err)
			}
		}
		return nil
	})
}

// waitWriters waits up to 30 s for role's transactions that hold a transaction id (they wrote)
// to end, logging them once with say.
func waitWriters(ctx context.Context, w *pgx.Conn, role string, say func(string, ...any)) error {
	deadline := time.Now().Add(30 * time.Second)
	told := false
	for {
		var pids []int32
		err := w.QueryRow(ctx, `select coalesce(array_agg(pid), '{}') from pg_stat_activity
where usename = $1 and backend_xid is not null and pid <> pg_backend_pid()`, role).Scan(&pids)
		if err != nil {
			return fmt.Errorf("read the transactions of role %s: %w", role, err)
		}
		if len(pids) == 0 || time.Now().After(deadline) {
			return nil
		}
		if !told {
			say("cutover: waiting for the role's open write transactions to end", "role", role, "pids", pids)
			told = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// giveBackWrites grants back what the open write pause of slot revoked and records it given
// back, and returns its role; without an open pause it does nothing and returns "".
func giveBackWrites(ctx context.Context, w, tgt *pgx.Conn, slot string, say func(string, ...any)) (string, error) {
	p, err := openPause(ctx, tgt, slot)
	if err != nil || p == nil {
		return "", err
	}
	rows, err := tgt.Query(ctx, `select table_name, privilege, grantable from pgconverge.write_pause_grants where slot = $1 order by 1, 2`, slot)
	if err != nil {
		return "", fmt.Errorf("read the privileges to give back: %w", err)
	}
	var table, privilege string
	var grantable bool
	var stmts []string
	_, err = pgx.ForEachRow(rows, []any{&table, &privilege, &grantable}, func() error {
		s := "grant " + privilege + " on table " + table + " to " + pgx.Identifier{p.role}.Sanitize()
		if grantable {
			s += " with grant option"
		}
		stmts = append(stmts, s)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("read the privileges to give back: %w", err)
	}
	err = pgx.BeginFunc(ctx, w, func(tx pgx.Tx) error {
		for _, s := range stmts {
			if _, err := tx.Exec(ctx, s); err != nil {
				return fmt.Errorf("give back the writes of role %s on the source (%s): %w", p.role, s, err)
			}
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	if err := endPause(ctx, tgt, slot, "given back"); err != nil {
		return "", err
	}
	say("cutover: gave the application's writes back on the source", "role", p.role, "privileges", len(stmts))
	return p.role, nil
}

// endPause records the open write pause of slot ended with outcome.
func endPause(ctx context.Context, tgt *pgx.Conn, slot, outcome string) error {
	_, err := tgt.Exec(ctx, `update pgconverge.write_pauses set ended_at = now(), outcome = $2 where slot = $1 and outcome is null`, slot, outcome)
	if err != nil {
		return fmt.Errorf("record the end of the write pause: %w", err)
	}
	return nil
}
