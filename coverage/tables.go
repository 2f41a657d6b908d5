package coverage

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// The ledger's view of each table (pgconverge.tables): whether it is streamed or kept by
// snapshots, which slot follows it since its last load, and which publication that stream reads.

// KeptBySnapshots returns the tables the ledger keeps by snapshots only (snapshot_only set) that
// were not retired, in name order. It reads a metadata schema of an older version too (a daemon
// reads it before it brings the schema up to date): one without snapshot_only keeps none, one
// without retired_at retired none.
func KeptBySnapshots(ctx context.Context, db DB) ([]changebatch.TableName, error) {
	cols, err := tablesColumns(ctx, db)
	if err != nil || !cols["snapshot_only"] {
		return nil, err
	}
	where := "snapshot_only is not null"
	if cols["retired_at"] {
		where += " and retired_at is null"
	}
	rows, err := db.Query(ctx, `select schema_name, table_name from pgconverge.tables where `+where+` order by 1, 2`)
	if err != nil {
		return nil, fmt.Errorf("read the tables kept by snapshots: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[changebatch.TableName])
}

// StreamedTables returns the tables the ledger registers as streamed (snapshot_only not set),
// retired ones included, in no order; every registered table in a metadata schema of a version
// before snapshot_only.
func StreamedTables(ctx context.Context, db DB) ([]changebatch.TableName, error) {
	cols, err := tablesColumns(ctx, db)
	if err != nil {
		return nil, err
	}
	q := `select schema_name, table_name from pgconverge.tables`
	if cols["snapshot_only"] {
		q += ` where snapshot_only is null`
	}
	rows, err := db.Query(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("read the streamed tables: %w", err)
	}
	return pgx.CollectRows(rows, pgx.RowToStructByPos[changebatch.TableName])
}

// tablesColumns returns the names of pgconverge.tables' columns, which grew with the metadata
// schema's versions (migrations).
func tablesColumns(ctx context.Context, db DB) (map[string]bool, error) {
	rows, err := db.Query(ctx, `select attname::text from pg_attribute where attrelid = 'pgconverge.tables'::regclass and attnum > 0 and not attisdropped`)
	if err != nil {
		return nil, fmt.Errorf("read the columns of pgconverge.tables: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("read the columns of pgconverge.tables: %w", err)
	}
	cols := map[string]bool{}
	for _, n := range names {
		cols[n] = true
	}
	return cols, nil
}

// LedgerPublication returns the publication the stream that follows table t reads, as the ledger
// records it: that of the latest stream segment of t's slot (pgconverge.tables.slot), else, for a
// table marked not loaded (its slot cleared, say after a membership change under
// --on-gap=alert), that of the segment of t's latest stream span; "" when no stream ever
// followed t or the ledger does not know it.
func LedgerPublication(ctx context.Context, db DB, t changebatch.TableName) (string, error) {
	var pub *string
	err := db.QueryRow(ctx, `select coalesce(
  (select s.publication from pgconverge.stream_segments s where s.slot = t.slot order by s.id desc limit 1),
  (select s.publication from pgconverge.table_spans sp join pgconverge.stream_segments s on s.id = sp.segment_id
    where sp.schema_name = t.schema_name and sp.table_name = t.table_name order by sp.id desc limit 1))
from pgconverge.tables t where t.schema_name = $1 and t.table_name = $2`, t.Schema, t.Name).Scan(&pub)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && pub == nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the publication that follows %s: %w", t, err)
	}
	return *pub, nil
}

// ErrUnknownTable is returned by Followed for a table the ledger does not register.
var ErrUnknownTable = errors.New("not in pgconverge.tables")

// Followed is a table's load and stream as the ledger records them: Loaded when its last load or
// backfill completed (loaded_lsn set), and Slot, the slot whose stream follows it since, "" when
// none does.
type Followed struct {
	Loaded bool
	Slot   string
}

// ReadFollowed returns how table n is loaded and followed; ErrUnknownTable (wrapped) when the
// ledger does not register it.
func ReadFollowed(ctx context.Context, db DB, n changebatch.TableName) (Followed, error) {
	var loaded, slot *string
	err := db.QueryRow(ctx, `select loaded_lsn::text, slot from pgconverge.tables where schema_name = $1 and table_name = $2`,
		n.Schema, n.Name).Scan(&loaded, &slot)
	if errors.Is(err, pgx.ErrNoRows) {
		return Followed{}, fmt.Errorf("%s: %w", n, ErrUnknownTable)
	}
	if err != nil {
		return Followed{}, fmt.Errorf("read the state of %s: %w", n, err)
	}
	f := Followed{Loaded: loaded != nil}
	if slot != nil {
		f.Slot = *slot
	}
	return f, nil
}

// StreamState is what the ledger says, in one statement, of table n and the stream of slot at a
// snapshot LSN s: Applied, the slot's progress ("" when it has none); Passed, whether that
// progress is at or past s; Loaded, whether n's last load completed and slot follows it since.
type StreamState struct {
	Applied        string
	Passed, Loaded bool
}

// ReadStreamState returns the StreamState of table n, slot and s, read through db (for verify, its
// repeatable-read target transaction).
func ReadStreamState(ctx context.Context, db DB, n changebatch.TableName, slot string, s pglogrepl.LSN) (StreamState, error) {
	var applied *string
	var st StreamState
	err := db.QueryRow(ctx, `select (select applied_lsn::text from pgconverge.progress where slot = $3),
  coalesce((select applied_lsn >= $4::pg_lsn from pgconverge.progress where slot = $3), false),
  coalesce((select loaded_lsn is not null and slot = $3 from pgconverge.tables where schema_name = $1 and table_name = $2), false)`,
		n.Schema, n.Name, slot, s.String()).Scan(&applied, &st.Passed, &st.Loaded)
	if err != nil {
		return StreamState{}, fmt.Errorf("read the state of %s: %w", n, err)
	}
	if applied != nil {
		st.Applied = *applied
	}
	return st, nil
}
