package coverage

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// DB is what the ledger needs of the target: a connection or a transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Segment is an open stream segment of the ledger (pgconverge.stream_segments).
type Segment struct {
	ID int64
	// Start is the first LSN covered; End is where the segment ends so far: its slot's progress.
	Start, End pglogrepl.LSN
}

// OpenSegment returns slot's open segment, and false when it has none.
func OpenSegment(ctx context.Context, db DB, slot string) (Segment, bool, error) {
	var seg Segment
	var start, end *string
	err := db.QueryRow(ctx, `select s.id, s.start_lsn::text, p.applied_lsn::text
from pgconverge.stream_segments s left join pgconverge.progress p on p.slot = s.slot
where s.slot = $1 and s.end_lsn is null`, slot).Scan(&seg.ID, &start, &end)
	if errors.Is(err, pgx.ErrNoRows) {
		return Segment{}, false, nil
	}
	if err != nil {
		return Segment{}, false, fmt.Errorf("read open stream segment of slot %q: %w", slot, err)
	}
	if err := parseLSNs([]*string{start, end}, []*pglogrepl.LSN{&seg.Start, &seg.End}); err != nil {
		return Segment{}, false, fmt.Errorf("read open stream segment of slot %q: %w", slot, err)
	}
	if seg.End < seg.Start {
		seg.End = seg.Start
	}
	return seg, true, nil
}

// StartSegment opens a segment of slot from start, for a slot incarnation created at created (0:
// not known), and returns its id. The slot must have no open segment (EndSegment).
func StartSegment(ctx context.Context, db DB, slot string, created, start pglogrepl.LSN) (int64, error) {
	var id int64
	err := db.QueryRow(ctx, `insert into pgconverge.stream_segments (slot, slot_created_lsn, start_lsn)
values ($1, nullif($2, '0/0')::pg_lsn, $3::pg_lsn) returning id`, slot, created.String(), start.String()).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("record stream segment of slot %q from %s: %w", slot, start, err)
	}
	return id, nil
}

// ErrOtherSource is returned when the ledger's stream reads another source database than the one
// given, or the source went back to an earlier WAL position than the ledger's watermark (restored
// from a backup, failed over to a standby that lacks changes): the same database no longer.
var ErrOtherSource = errors.New("another source")

// CheckSource returns an error wrapping ErrOtherSource when slot's open segment streams from
// another source database than source (cdc.SourceID); a segment that recorded none matches.
func CheckSource(ctx context.Context, db DB, slot, source string) error {
	var recorded *string
	err := db.QueryRow(ctx, `select source from pgconverge.stream_segments where slot = $1 and end_lsn is null`, slot).Scan(&recorded)
	if errors.Is(err, pgx.ErrNoRows) || err == nil && (recorded == nil || *recorded == source) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the source of slot %q's stream segment: %w", slot, err)
	}
	return fmt.Errorf("%w: the target's ledger follows slot %q on source database %s (system identifier/database), but the source URL reaches %s: pass the source URL the daemon replicates from, or another --slot or target",
		ErrOtherSource, slot, *recorded, source)
}

// CheckTableSource returns an error wrapping ErrOtherSource when a stream follows table n from
// another source database than source (cdc.SourceID), or a backfill wrote rows of another source
// database into its current target table: two databases' rows would mix in one target table, and
// the version rule cannot order LSNs of different databases.
func CheckTableSource(ctx context.Context, db DB, n changebatch.TableName, source string) error {
	var other string
	err := db.QueryRow(ctx, `select s.source from pgconverge.table_spans t
join pgconverge.stream_segments s on s.id = t.segment_id
where t.end_lsn is null and s.end_lsn is null and t.schema_name = $1 and t.table_name = $2
  and s.source is not null and s.source <> $3
union all
select b.source from pgconverge.backfills b
join pgconverge.tables g on g.schema_name = b.schema_name and g.table_name = b.table_name and g.generation = b.generation
where b.schema_name = $1 and b.table_name = $2 and b.source is not null and b.source <> $3
limit 1`, n.Schema, n.Name, source).Scan(&other)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the source that streams %s: %w", n, err)
	}
	return fmt.Errorf("%w: target table %s holds rows of source database %s (system identifier/database), but the source URL reaches %s: use the source it was loaded from, or drop the target table (DROP TABLE %s CASCADE on the target: CASCADE drops its live view too, and any view of yours over it) to load it anew",
		ErrOtherSource, n, other, source, n.Quoted())
}

// UseSource records the publication and the source database (cdc.SourceID) slot's open segment
// streams from: its tables' publication membership tokens refer to that publication.
func UseSource(ctx context.Context, db DB, slot, publication, source string) error {
	_, err := db.Exec(ctx, `update pgconverge.stream_segments set publication = $2, source = $3 where slot = $1 and end_lsn is null`,
		slot, publication, source)
	if err != nil {
		return fmt.Errorf("record publication of slot %q's stream segment: %w", slot, err)
	}
	return nil
}

// EndSegment ends slot's open segment at end for reason, and its open table spans at end or,
// earlier, at their confirmed_lsn. It reports whether there was an open segment.
func EndSegment(ctx context.Context, db DB, slot string, end pglogrepl.LSN, reason string) (bool, error) {
	var id int64
	err := db.QueryRow(ctx, `update pgconverge.stream_segments set end_lsn = greatest(start_lsn, $2::pg_lsn),
  end_reason = $3, ended_at = now() where slot = $1 and end_lsn is null returning id`, slot, end.String(), reason).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("end stream segment of slot %q at %s: %w", slot, end, err)
	}
	_, err = db.Exec(ctx, `update pgconverge.table_spans set end_lsn = greatest(start_lsn, least(confirmed_lsn, $2::pg_lsn)),
  end_reason = $3, ended_at = now() where segment_id = $1 and end_lsn is null`, id, end.String(), reason)
	if err != nil {
		return false, fmt.Errorf("end table spans of slot %q at %s: %w", slot, end, err)
	}
	return true, nil
}

// gaps.Span end reasons that operators and the report branch on.
const (
	// ReasonDeselected ends a span when the table left the daemon's selection: --tables, or,
	// without --tables, the publication.
	ReasonDeselected = "no longer selected (not in --tables, or not in the publication without --tables)"
	// ReasonMembership ends a span when the table's publication membership changed.
	ReasonMembership = "publication membership changed"
)

// EndSpans ends the open spans of tables in slot's open segment for reason, at the slot's
// progress or, earlier, at their confirmed_lsn.
func EndSpans(ctx context.Context, db DB, slot string, tables []changebatch.TableName, reason string) error {
	_, err := endSpans(ctx, db, slot, tables, "in", reason)
	return err
}

// EndSpansExcept ends, for reason, the open spans in slot's open segment of every table not among
// keep, at the slot's progress or, earlier, at their confirmed_lsn, and returns their tables.
func EndSpansExcept(ctx context.Context, db DB, slot string, keep []changebatch.TableName, reason string) ([]changebatch.TableName, error) {
	return endSpans(ctx, db, slot, keep, "not in", reason)
}

// endSpans ends the open spans in slot's open segment of the tables that are (op "in") or are not
// (op "not in") among tables, and returns the tables whose span it ended.
func endSpans(ctx context.Context, db DB, slot string, tables []changebatch.TableName, op, reason string) ([]changebatch.TableName, error) {
	schemas, names := split(tables)
	rows, err := db.Query(ctx, `update pgconverge.table_spans t set
  end_lsn = greatest(t.start_lsn, least(t.confirmed_lsn, coalesce((select applied_lsn from pgconverge.progress where slot = $1), t.confirmed_lsn))),
  end_reason = $4, ended_at = now()
from pgconverge.stream_segments s
where s.id = t.segment_id and s.slot = $1 and s.end_lsn is null and t.end_lsn is null
  and (t.schema_name, t.table_name) `+op+` (select * from unnest($2::text[], $3::text[]))
returning t.schema_name, t.table_name`, slot, schemas, names, reason)
	if err != nil {
		return nil, fmt.Errorf("end table spans of slot %q (%s): %w", slot, reason, err)
	}
	ended, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (changebatch.TableName, error) {
		var n changebatch.TableName
		return n, r.Scan(&n.Schema, &n.Name)
	})
	if err != nil {
		return nil, fmt.Errorf("end table spans of slot %q (%s): %w", slot, reason, err)
	}
	return ended, nil
}

// ConfirmSpans records that tables were still published, with the membership their spans began
// with, at lsn: a source position read before the membership was checked.
func ConfirmSpans(ctx context.Context, db DB, slot string, tables []changebatch.TableName, lsn pglogrepl.LSN) error {
	schemas, names := split(tables)
	_, err := db.Exec(ctx, `update pgconverge.table_spans t set confirmed_lsn = greatest(t.confirmed_lsn, $4::pg_lsn)
from pgconverge.stream_segments s
where s.id = t.segment_id and s.slot = $1 and s.end_lsn is null and t.end_lsn is null
  and (t.schema_name, t.table_name) in (select * from unnest($2::text[], $3::text[]))`, slot, schemas, names, lsn.String())
	if err != nil {
		return fmt.Errorf("confirm publication membership of slot %q's tables at %s: %w", slot, lsn, err)
	}
	return nil
}

// SpanStart is where a new span of a table starts and the table's publication membership token.
type SpanStart struct {
	LSN        pglogrepl.LSN
	Membership string
}

// StartSpans opens a span in slot's open segment for each table of starts that has none in its
// target table's current generation; the span of an older generation is ended. It returns the
// tables it opened a span for.
func StartSpans(ctx context.Context, db DB, slot string, starts map[changebatch.TableName]SpanStart) ([]changebatch.TableName, error) {
	var opened []changebatch.TableName
	for n, start := range starts {
		_, err := db.Exec(ctx, `update pgconverge.table_spans t set end_lsn = t.start_lsn, end_reason = 'target table created anew', ended_at = now()
from pgconverge.stream_segments s, pgconverge.tables g
where s.id = t.segment_id and s.slot = $1 and s.end_lsn is null and t.end_lsn is null
  and t.schema_name = $2 and t.table_name = $3 and g.schema_name = $2 and g.table_name = $3 and t.generation <> g.generation`,
			slot, n.Schema, n.Name)
		if err != nil {
			return nil, fmt.Errorf("end stream span of %s's earlier target table: %w", n, err)
		}
		tag, err := db.Exec(ctx, `insert into pgconverge.table_spans (segment_id, schema_name, table_name, generation, membership, start_lsn, confirmed_lsn)
select s.id, $2, $3, g.generation, nullif($5, ''), $4::pg_lsn, $4::pg_lsn
from pgconverge.stream_segments s, pgconverge.tables g
where s.slot = $1 and s.end_lsn is null and g.schema_name = $2 and g.table_name = $3
on conflict do nothing`, slot, n.Schema, n.Name, start.LSN.String(), start.Membership)
		if err != nil {
			return nil, fmt.Errorf("record stream span of %s in slot %q from %s: %w", n, slot, start.LSN, err)
		}
		if tag.RowsAffected() > 0 {
			opened = append(opened, n)
		}
	}
	return opened, nil
}

// LatestSpan is the latest span of a table in its target table's current generation.
type LatestSpan struct {
	// Open is true when it is open in slot's open segment (as LatestSpans was asked).
	Open bool
	// Membership is the table's publication membership token when the span began.
	Membership string
}

// LatestSpans returns, for each of tables that has one, its latest span in its target table's
// current generation, in any slot's segment.
func LatestSpans(ctx context.Context, db DB, slot string, tables []changebatch.TableName) (map[changebatch.TableName]LatestSpan, error) {
	schemas, names := split(tables)
	rows, err := db.Query(ctx, `select distinct on (t.schema_name, t.table_name) t.schema_name, t.table_name,
  t.end_lsn is null and s.slot = $1 and s.end_lsn is null, coalesce(t.membership, '')
from pgconverge.table_spans t
join pgconverge.stream_segments s on s.id = t.segment_id
join pgconverge.tables g on g.schema_name = t.schema_name and g.table_name = t.table_name and g.generation = t.generation
where (t.schema_name, t.table_name) in (select * from unnest($2::text[], $3::text[]))
order by t.schema_name, t.table_name, t.id desc`, slot, schemas, names)
	if err != nil {
		return nil, fmt.Errorf("read the latest stream spans: %w", err)
	}
	defer rows.Close()
	out := map[changebatch.TableName]LatestSpan{}
	for rows.Next() {
		var n changebatch.TableName
		var l LatestSpan
		if err := rows.Scan(&n.Schema, &n.Name, &l.Open, &l.Membership); err != nil {
			return nil, fmt.Errorf("read the latest stream spans: %w", err)
		}
		out[n] = l
	}
	return out, rows.Err()
}

func split(tables []changebatch.TableName) ([]string, []string) {
	schemas, names := make([]string, len(tables)), make([]string, len(tables))
	for i, t := range tables {
		schemas[i], names[i] = t.Schema, t.Name
	}
	return schemas, names
}

func parseLSNs(in []*string, out []*pglogrepl.LSN) error {
	for i, s := range in {
		if s == nil {
			continue
		}
		l, err := pglogrepl.ParseLSN(*s)
		if err != nil {
			return err
		}
		*out[i] = l
	}
	return nil
}
