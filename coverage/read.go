package coverage

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/coverage/gaps"
)

// TableState is what the ledger holds about one table in its target table's current generation.
type TableState struct {
	Table changebatch.TableName
	// Ledger is the input of Gaps; its Watermark is where the table's open span ends (its slot's
	// progress), or where its last span ended when no stream follows it now.
	Ledger gaps.Ledger
	// Backfilled is the smallest S of the chunks of the latest completed backfill, 0 when the
	// table never completed one; BackfillID is that backfill's id.
	Backfilled pglogrepl.LSN
	BackfillID int64
	// Streaming is true when a stream follows the table now (an open span): Slot's, since
	// StreamStart, membership confirmed up to Confirmed. Otherwise LastEndReason says why its last
	// span ended ("" when it never had one).
	Streaming     bool
	Slot          string
	StreamStart   pglogrepl.LSN
	Confirmed     pglogrepl.LSN
	LastEndReason string
	// TargetReplaced is true when the target table is missing or is not the one the ledger
	// registered (dropped or replaced by hand): nothing the ledger recorded is in it.
	TargetReplaced bool
	// Membership is the publication membership token (of Publication, the publication of the
	// stream that follows the table) the open span began with.
	Membership, Publication string
	// WatermarkAge is how long ago the stream last recorded its progress (the target's clock:
	// pgconverge.progress.updated_at); a running daemon records it at least every few seconds,
	// idle source or not (keepalives move it), so a growing age means no daemon follows.
	WatermarkAge time.Duration
	// Source is the source database the stream reads (cdc.SourceID), "" when not recorded.
	Source string
	// SchemaChanged is the table's schema_changed_lsn (apply.EnsureTable), 0 when none: backfill
	// chunks read at or before it do not count.
	SchemaChanged pglogrepl.LSN
	// SnapshotOnly is why no publication can carry the table's changes ("" for a streamed table):
	// backfills alone keep it (MarkSnapshotOnly). LoadedAge is how long ago its last load completed
	// (the target's clock), 0 when it never completed one. KeptBy is the slot whose daemon keeps
	// it (KeepSnapshotOnly), "" when none does.
	SnapshotOnly string
	LoadedAge    time.Duration
	KeptBy       string
	// Retired is when the table was retired (Retire, RetireLeft), nil when it was not;
	// RetiredReason says why.
	Retired       *time.Time
	RetiredReason string
}

// ReadTables returns the ledger of every table pgconverge.tables registers, keyed by name.
func ReadTables(ctx context.Context, db DB) (map[changebatch.TableName]*TableState, error) {
	out := map[changebatch.TableName]*TableState{}
	rows, err := db.Query(ctx, `select schema_name, table_name, coalesce(truncated_lsn, '0/0')::text, coalesce(schema_changed_lsn, '0/0')::text, coalesce(membership, ''),
  to_regclass(format('%I.%I', schema_name, table_name)) is null
    or coalesce(target_oid <> to_regclass(format('%I.%I', schema_name, table_name))::oid, false),
  coalesce(snapshot_only, ''), coalesce(extract(epoch from now() - loaded_at)::float8, 0), retired_at, coalesce(retired_reason, ''),
  coalesce(kept_by, '')
from pgconverge.tables`)
	if err != nil {
		return nil, fmt.Errorf("read coverage ledger tables: %w", err)
	}
	for rows.Next() {
		st := &TableState{}
		var truncated, changed string
		var age float64
		if err := rows.Scan(&st.Table.Schema, &st.Table.Name, &truncated, &changed, &st.Membership, &st.TargetReplaced, &st.SnapshotOnly, &age, &st.Retired, &st.RetiredReason, &st.KeptBy); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read coverage ledger tables: %w", err)
		}
		if err := parseLSNs([]*string{&truncated, &changed}, []*pglogrepl.LSN{&st.Ledger.Truncated, &st.SchemaChanged}); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read coverage ledger tables: %w", err)
		}
		st.LoadedAge = time.Duration(age * float64(time.Second))
		out[st.Table] = st
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read coverage ledger tables: %w", err)
	}
	if err := readSpans(ctx, db, out); err != nil {
		return nil, err
	}
	if err := readBackfills(ctx, db, out); err != nil {
		return nil, err
	}
	return out, nil
}

// readSpans adds the stream spans of the tables' current generation, oldest first.
func readSpans(ctx context.Context, db DB, out map[changebatch.TableName]*TableState) error {
	rows, err := db.Query(ctx, `select t.schema_name, t.table_name, s.slot, coalesce(s.publication, ''), coalesce(s.source, ''), t.start_lsn::text,
  coalesce(t.end_lsn, greatest(t.start_lsn, p.applied_lsn), t.start_lsn)::text, t.end_lsn is null,
  t.confirmed_lsn::text, coalesce(t.end_reason, ''), coalesce(t.membership, ''),
  coalesce(extract(epoch from now() - p.updated_at), 0)::float8
from pgconverge.table_spans t
join pgconverge.stream_segments s on s.id = t.segment_id
join pgconverge.tables g on g.schema_name = t.schema_name and g.table_name = t.table_name and g.generation = t.generation
left join pgconverge.progress p on p.slot = s.slot
order by t.id`)
	if err != nil {
		return fmt.Errorf("read coverage ledger spans: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var n changebatch.TableName
		var slot, pub, source, start, end, confirmed, reason, member string
		var open bool
		var age float64
		if err := rows.Scan(&n.Schema, &n.Name, &slot, &pub, &source, &start, &end, &open, &confirmed, &reason, &member, &age); err != nil {
			return fmt.Errorf("read coverage ledger spans: %w", err)
		}
		st := out[n]
		if st == nil {
			continue
		}
		var sp gaps.Span
		var conf pglogrepl.LSN
		if err := parseLSNs([]*string{&start, &end, &confirmed}, []*pglogrepl.LSN{&sp.From, &sp.To, &conf}); err != nil {
			return fmt.Errorf("read coverage ledger spans: %w", err)
		}
		st.Ledger.Spans = append(st.Ledger.Spans, sp)
		st.Ledger.Watermark = sp.To
		st.Streaming, st.LastEndReason = open, reason
		if open {
			st.Slot, st.StreamStart, st.Confirmed, st.Publication, st.Source = slot, sp.From, conf, pub, source
			st.WatermarkAge = time.Duration(age * float64(time.Second))
			if member != "" {
				st.Membership = member
			}
		}
	}
	return rows.Err()
}

// readBackfills adds the chunks of each table's latest completed backfill of its current
// generation (a block plan's marked Blocks: its key_columns are {ctid}, migration 010) (one chunk at the backfill's S for a backfill recorded without chunks), without the
// chunks read at or before the table's schema_changed_lsn: their rows lack a column's values (a
// chunk read at exactly that position may predate the target table's change: the position need
// not move in between; a backfill started later reads at a later one, as creating its slot writes
// WAL).
func readBackfills(ctx context.Context, db DB, out map[changebatch.TableName]*TableState) error {
	rows, err := db.Query(ctx, `with latest as (
  select distinct on (b.schema_name, b.table_name) b.id, b.schema_name, b.table_name, b.snapshot_lsn, b.key_columns
  from pgconverge.backfills b
  join pgconverge.tables g on g.schema_name = b.schema_name and g.table_name = b.table_name and g.generation = b.generation
  where b.status = 'completed'
  order by b.schema_name, b.table_name, b.id desc)
select l.schema_name, l.table_name, l.id, c.lower_key, c.upper_key, l.key_columns = '{ctid}', coalesce(c.snapshot_lsn, l.snapshot_lsn)::text
from latest l left join pgconverge.backfill_chunks c on c.backfill_id = l.id
join pgconverge.tables g on g.schema_name = l.schema_name and g.table_name = l.table_name
where coalesce(c.snapshot_lsn, l.snapshot_lsn) > coalesce(g.schema_changed_lsn, '0/0')
order by l.id, c.chunk`)
	if err != nil {
		return fmt.Errorf("read coverage ledger backfills: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var n changebatch.TableName
		var id int64
		var c gaps.Chunk
		var s string
		var blocks *bool
		if err := rows.Scan(&n.Schema, &n.Name, &id, &c.Lower, &c.Upper, &blocks, &s); err != nil {
			return fmt.Errorf("read coverage ledger backfills: %w", err)
		}
		if c.S, err = pglogrepl.ParseLSN(s); err != nil {
			return fmt.Errorf("read coverage ledger backfills: %w", err)
		}
		c.Blocks = blocks != nil && *blocks
		st := out[n]
		if st == nil {
			continue
		}
		st.BackfillID = id
		st.Ledger.Chunks = append(st.Ledger.Chunks, c)
		if st.Backfilled == 0 || c.S < st.Backfilled {
			st.Backfilled = c.S
		}
	}
	return rows.Err()
}
