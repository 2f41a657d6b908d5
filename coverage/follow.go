package coverage

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// followLockClass is the first key of the advisory lock ('pgcf') that a daemon holds, in the
// transaction that records which tables its stream follows, while it checks that no other slot
// follows them (LockFollowing).
const followLockClass = 0x70676366

// LockFollowing takes, in the transaction db is in, the target's lock for recording which tables
// streams follow: a daemon that checks FollowedElsewhere and then opens its spans (StartSpans) in
// that transaction sees every span another daemon opened under the same lock, so two daemons that
// start at once cannot both take a table. The lock is released when the transaction ends.
func LockFollowing(ctx context.Context, db DB) error {
	if _, err := db.Exec(ctx, `select pg_advisory_xact_lock($1, 0)`, followLockClass); err != nil {
		return fmt.Errorf("take the lock for recording which tables the streams follow: %w", err)
	}
	return nil
}

// Follower is a table that the stream of a slot follows: the table has an open span in the slot's
// open segment.
type Follower struct {
	Table changebatch.TableName
	Slot  string
}

// FollowedElsewhere returns, ordered by table then slot, the tables among tables that the stream
// of a slot other than slot follows (an open span in that slot's open segment, of any generation:
// the stream writes the table whatever the generation). It says nothing of whether that slot's
// daemon runs now.
func FollowedElsewhere(ctx context.Context, db DB, slot string, tables []changebatch.TableName) ([]Follower, error) {
	schemas, names := split(tables)
	rows, err := db.Query(ctx, `select distinct t.schema_name, t.table_name, s.slot
from pgconverge.table_spans t join pgconverge.stream_segments s on s.id = t.segment_id
where s.end_lsn is null and t.end_lsn is null and s.slot <> $1
  and (t.schema_name, t.table_name) in (select * from unnest($2::text[], $3::text[]))
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
