package coverage

import (
	"context"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// Loaded state and publication membership of each table (pgconverge.tables: loaded_lsn, slot,
// membership): whether the table's last completed load is followed by a slot's stream, and the
// catalog token of its membership in the publication that stream reads.

// LoadedTables returns the tables whose last completed load or backfill was followed without a
// break by slot's stream, with that load's snapshot LSN S, keyed by changebatch.QualifiedName.
func LoadedTables(ctx context.Context, conn *pgx.Conn, slot string) (map[string]pglogrepl.LSN, error) {
	rows, err := conn.Query(ctx, `select schema_name, table_name, loaded_lsn::text from pgconverge.tables
where loaded_lsn is not null and slot = $1`, slot)
	if err != nil {
		return nil, fmt.Errorf("read loaded tables: %w", err)
	}
	defer rows.Close()
	out := map[string]pglogrepl.LSN{}
	for rows.Next() {
		var s, n, l string
		if err := rows.Scan(&s, &n, &l); err != nil {
			return nil, fmt.Errorf("read loaded tables: %w", err)
		}
		lsn, err := pglogrepl.ParseLSN(l)
		if err != nil {
			return nil, fmt.Errorf("read loaded tables: %w", err)
		}
		out[changebatch.QualifiedName(s, n)] = lsn
	}
	return out, rows.Err()
}

// ForgetTables clears the loaded state of every table slot's stream carried so far but that is not
// among keep: from now on its changes are not applied, so it must be loaded again if it is
// selected again. It returns the names of the tables it forgot.
func ForgetTables(ctx context.Context, conn *pgx.Conn, slot string, keep []changebatch.Table) ([]string, error) {
	schemas, names := make([]string, len(keep)), make([]string, len(keep))
	for i, t := range keep {
		schemas[i], names[i] = t.Schema, t.Name
	}
	rows, err := conn.Query(ctx, `update pgconverge.tables t set loaded_lsn = null, loaded_at = null, slot = null
where slot = $1 and (schema_name, table_name) not in (select * from unnest($2::text[], $3::text[]))
returning schema_name, table_name`, slot, schemas, names)
	if err != nil {
		return nil, fmt.Errorf("forget tables no longer replicated by slot %q: %w", slot, err)
	}
	defer rows.Close()
	var out []string
	var forgot [][2]string
	for rows.Next() {
		var s, n string
		if err := rows.Scan(&s, &n); err != nil {
			return nil, fmt.Errorf("forget tables no longer replicated by slot %q: %w", slot, err)
		}
		out = append(out, changebatch.QualifiedName(s, n))
		forgot = append(forgot, [2]string{s, n})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("forget tables no longer replicated by slot %q: %w", slot, err)
	}
	rows.Close()
	for _, f := range forgot {
		if err := AbandonBackfills(ctx, conn, changebatch.TableName{Schema: f[0], Name: f[1]}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// MarkUnloaded clears the loaded state of tables: each is loaded again before it counts as
// covered.
func MarkUnloaded(ctx context.Context, conn *pgx.Conn, tables []changebatch.Table) error {
	for _, t := range tables {
		_, err := conn.Exec(ctx, `update pgconverge.tables set loaded_lsn = null, loaded_at = null, slot = null
where schema_name = $1 and table_name = $2`, t.Schema, t.Name)
		if err != nil {
			return fmt.Errorf("mark %s for loading: %w", t, err)
		}
		if err := AbandonBackfills(ctx, conn, t.TableName); err != nil {
			return err
		}
	}
	return nil
}

// SyncMembership records token as table t's publication membership (cdc.Memberships) and returns
// the token recorded before ("" when none was) and the slot that followed the table then
// (pgconverge.tables.slot, "" when none did). When the token differs from a token recorded before,
// the table left the publication in between (or another slot's publication recorded it) and the
// stream missed its changes: the table is marked for loading.
func SyncMembership(ctx context.Context, conn *pgx.Conn, t changebatch.Table, token string) (old, oldSlot string, err error) {
	err = conn.QueryRow(ctx, `with old as (
  select membership, slot from pgconverge.tables where schema_name = $1 and table_name = $2 for update)
update pgconverge.tables t set membership = $3,
  loaded_lsn = case when old.membership is distinct from $3 then null else t.loaded_lsn end,
  loaded_at = case when old.membership is distinct from $3 then null else t.loaded_at end,
  slot = case when old.membership is distinct from $3 then null else t.slot end
from old where t.schema_name = $1 and t.table_name = $2
returning coalesce(old.membership, ''), coalesce(old.slot, '')`, t.Schema, t.Name, token).Scan(&old, &oldSlot)
	if err != nil {
		return "", "", fmt.Errorf("record publication membership of %s: %w", t, err)
	}
	if old != "" && old != token {
		return old, oldSlot, AbandonBackfills(ctx, conn, t.TableName)
	}
	return old, oldSlot, nil
}

// LastFollower returns the slot whose stream last followed table t (the segment of its latest
// span), "" when no stream ever did.
func LastFollower(ctx context.Context, conn *pgx.Conn, t changebatch.TableName) (string, error) {
	var slot string
	err := conn.QueryRow(ctx, `select coalesce((select g.slot from pgconverge.table_spans s join pgconverge.stream_segments g on g.id = s.segment_id
  where s.schema_name = $1 and s.table_name = $2 order by s.id desc limit 1), '')`, t.Schema, t.Name).Scan(&slot)
	if err != nil {
		return "", fmt.Errorf("read the slot that last followed %s: %w", t, err)
	}
	return slot, nil
}

// MarkSnapshotOnly records, per table, why no publication can carry its changes
// (changebatch.Table.SnapshotOnly) in pgconverge.tables.snapshot_only: NULL for a streamed table.
// A table kept by snapshots follows no slot; a streamed one is kept by no daemon
// (KeepSnapshotOnly). It returns the streamed tables that were kept by
// snapshots only until now: they join the stream.
func MarkSnapshotOnly(ctx context.Context, conn *pgx.Conn, tables []changebatch.Table) ([]changebatch.TableName, error) {
	var joined []changebatch.TableName
	for _, t := range tables {
		var was bool
		err := conn.QueryRow(ctx, `with old as (select snapshot_only is not null as was from pgconverge.tables
  where schema_name = $1 and table_name = $2 for update),
u as (update pgconverge.tables set snapshot_only = nullif($3, ''), slot = case when $3 = '' then slot end,
    kept_by = case when $3 <> '' then kept_by end
  where schema_name = $1 and table_name = $2)
select coalesce((select was from old), false)`, t.Schema, t.Name, t.SnapshotOnly).Scan(&was)
		if err != nil {
			return nil, fmt.Errorf("record whether %s is kept by snapshots only: %w", t, err)
		}
		if was && t.SnapshotOnly == "" {
			joined = append(joined, t.TableName)
		}
	}
	return joined, nil
}
