package coverage

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/advisory"
)

// LockFollowing takes, in the transaction db is in, the target's lock for recording which tables
// streams follow (advisory.Follow): a daemon that checks FollowedElsewhere and then opens its spans (StartSpans) in
// that transaction sees every span another daemon opened under the same lock, so two daemons that
// start at once cannot both take a table. The lock is released when the transaction ends.
func LockFollowing(ctx context.Context, db DB) error {
	if _, err := db.Exec(ctx, `select `+advisory.Follow().XactLock()); err != nil {
		return fmt.Errorf("take the lock for recording which tables the streams follow: %w", err)
	}
	return nil
}

// Follower is a table that a slot follows: the table has an open span in the slot's open segment
// (its stream follows it), or, kept by snapshots only, the slot keeps it (KeepSnapshotOnly).
type Follower struct {
	Table changebatch.TableName
	Slot  string
}

// FollowedElsewhere returns, ordered by table then slot, the tables among tables that a slot other
// than slot follows: its stream (an open span in that slot's open segment, of any generation: the
// stream writes the table whatever the generation), or, for a table kept by snapshots only, its
// daemon (pgconverge.tables.kept_by). It says nothing of whether that slot's daemon runs now.
func FollowedElsewhere(ctx context.Context, db DB, slot string, tables []changebatch.TableName) ([]Follower, error) {
	schemas, names := split(tables)
	rows, err := db.Query(ctx, `select t.schema_name, t.table_name, s.slot
from pgconverge.table_spans t join pgconverge.stream_segments s on s.id = t.segment_id
where s.end_lsn is null and t.end_lsn is null and s.slot <> $1
  and (t.schema_name, t.table_name) in (select * from unnest($2::text[], $3::text[]))
union
select schema_name, table_name, kept_by from pgconverge.tables
where kept_by <> $1 and snapshot_only is not null
  and (schema_name, table_name) in (select * from unnest($2::text[], $3::text[]))
order by 1, 2, 3`, slot, schemas, names)
	if err != nil {
		return nil, fmt.Errorf("read which other slots follow the selected tables: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Follower, error) {
		var f Follower
		return f, r.Scan(&f.Table.Schema, &f.Table.Name, &f.Slot)
	})
	if err != nil {
		return nil, fmt.Errorf("read which other slots follow the selected tables: %w", err)
	}
	return out, nil
}

// KeepSnapshotOnly records, in the transaction db is in (under LockFollowing), that slot's daemon
// keeps the snapshot-only tables kept, taking them from any other slot, and keeps no other table
// any more.
func KeepSnapshotOnly(ctx context.Context, db DB, slot string, kept []changebatch.TableName) error {
	schemas, names := split(kept)
	_, err := db.Exec(ctx, `update pgconverge.tables set kept_by = case when (schema_name, table_name) in (select * from unnest($2::text[], $3::text[])) then $1 end
where kept_by = $1 or (schema_name, table_name) in (select * from unnest($2::text[], $3::text[]))`, slot, schemas, names)
	if err != nil {
		return fmt.Errorf("record the tables kept by snapshots only that slot %q keeps: %w", slot, err)
	}
	return nil
}

// Wait is a selected table that a slot's daemon leaves to the running daemon of another slot,
// FollowedBy, and waits for, since Since (pgconverge.table_waits).
type Wait struct {
	Slot       string    `json:"slot"`
	Table      string    `json:"table"`
	FollowedBy string    `json:"followed_by"`
	Since      time.Time `json:"since"`
}

// RecordWaits replaces the tables slot's daemon waits for with waiting (each table's follower);
// a table waited for by the same follower keeps its Since.
func RecordWaits(ctx context.Context, db DB, slot string, waiting []Follower) error {
	schemas, names := make([]string, len(waiting)), make([]string, len(waiting))
	followers := make([]string, len(waiting))
	for i, f := range waiting {
		schemas[i], names[i], followers[i] = f.Table.Schema, f.Table.Name, f.Slot
	}
	_, err := db.Exec(ctx, `with w as (select * from unnest($2::text[], $3::text[], $4::text[]) as w(s, n, f)),
d as (delete from pgconverge.table_waits x where x.slot = $1
  and not exists (select 1 from w where w.s = x.schema_name and w.n = x.table_name and w.f = x.followed_by))
insert into pgconverge.table_waits (slot, schema_name, table_name, followed_by)
select $1, s, n, f from w on conflict (slot, schema_name, table_name) do nothing`, slot, schemas, names, followers)
	if err != nil {
		return fmt.Errorf("record the tables slot %q waits for: %w", slot, err)
	}
	return nil
}

// ReadWaits returns every recorded wait (RecordWaits), by slot then table; none when the target's
// schema predates them (version 13).
func ReadWaits(ctx context.Context, db DB) ([]Wait, error) {
	rows, err := db.Query(ctx, `select slot, schema_name, table_name, followed_by, since from pgconverge.table_waits order by 1, 2, 3`)
	if err != nil {
		if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == pgerrcode.UndefinedTable {
			return nil, nil
		}
		return nil, fmt.Errorf("read the tables waiting daemons wait for (pgconverge.table_waits): %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Wait, error) {
		var w Wait
		var t changebatch.TableName
		err := r.Scan(&w.Slot, &t.Schema, &t.Name, &w.FollowedBy, &w.Since)
		w.Table = t.String()
		return w, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the tables waiting daemons wait for (pgconverge.table_waits): %w", err)
	}
	return out, nil
}
