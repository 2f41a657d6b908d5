package apply

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// Quoted metadata column names, for building SQL.
var (
	qLSN     = pgx.Identifier{changebatch.ColLSN}.Sanitize()
	qSeq     = pgx.Identifier{changebatch.ColSeq}.Sanitize()
	qDeleted = pgx.Identifier{changebatch.ColDeleted}.Sanitize()
	qUnknown = pgx.Identifier{changebatch.ColUnknown}.Sanitize()
)

// createTableSQL returns the DDL of the target table for t: the source's columns and types, the
// same key as primary key (in the source key's column order), every non-key column nullable (tombstones carry only the key), plus the
// version and tombstone columns. It does nothing when the table exists.
func createTableSQL(t changebatch.Table) string {
	var b strings.Builder
	b.WriteString("create table if not exists ")
	b.WriteString(t.Quoted())
	b.WriteString(" (")
	writeColumnsDDL(&b, t)
	var keys []string
	for _, i := range t.KeyOrder() {
		keys = append(keys, pgx.Identifier{t.Columns[i].Name}.Sanitize())
	}
	b.WriteString(qLSN + " pg_lsn not null, ")
	b.WriteString(qSeq + " bigint not null, ")
	b.WriteString(qDeleted + " boolean not null default false, ")
	b.WriteString(qUnknown + " text[], ")
	b.WriteString("primary key (" + strings.Join(keys, ", ") + "))")
	return b.String()
}

// writeColumnsDDL writes the column definitions of t's data columns (key columns NOT NULL) and
// generated columns, each followed by ", ".
func writeColumnsDDL(b *strings.Builder, t changebatch.Table) {
	for _, c := range t.Columns {
		b.WriteString(pgx.Identifier{c.Name}.Sanitize() + " " + c.Type)
		if c.Key {
			b.WriteString(" not null")
		}
		b.WriteString(", ")
	}
	for _, g := range t.Generated {
		fmt.Fprintf(b, "%s %s generated always as (%s) stored, ", pgx.Identifier{g.Name}.Sanitize(), g.Type, g.Expr)
	}
}

// qMoved names the staging-only column that marks a moved row whose unknown columns must not be
// taken from the target row of its new key.
var qMoved = pgx.Identifier{"_cdc_moved"}.Sanitize()

// createStageSQL returns the DDL of the session's staging table for a target table: the columns
// of copyColumns in that order, with the target's types and type modifiers, then _cdc_moved, so
// that its row type is also what an inline merge's record literals spell (inline.go). It is
// emptied by Tx.stage, not ON COMMIT DELETE ROWS: see stageTruncateRows.
func createStageSQL(t changebatch.Table, stage string) string {
	return "create temporary table " + pgx.Identifier{stage}.Sanitize() + " as select " +
		strings.Join(copyColumns(t), ", ") + ", false as " + qMoved + " from " + t.Quoted() + " with no data"
}

// copyColumns lists the staged columns in COPY order: the data columns, then the metadata.
func copyColumns(t changebatch.Table) []string {
	cols := make([]string, 0, len(t.Columns)+4)
	for _, c := range t.Columns {
		cols = append(cols, pgx.Identifier{c.Name}.Sanitize())
	}
	return append(cols, qLSN, qSeq, qDeleted, qUnknown)
}

// copySQL returns the COPY statement that fills the staging table.
func copySQL(t changebatch.Table, stage string) string {
	return "copy " + pgx.Identifier{"pg_temp", stage}.Sanitize() +
		" (" + strings.Join(append(copyColumns(t), qMoved), ", ") + ") from stdin"
}

// upsertSQL returns the guarded merge of a piece's rows (src: the staging table, or inline
// records) into the target table and its arguments, for the rows whose _cdc_moved equals moved.
// A row is written only when its version is above the table's TRUNCATE fence and, for an
// existing key, above the stored version. Keys equal by the key type's equality but spelled differently (numeric 1.0 and 1.00)
// are first reduced, over all staged rows, to the newest version (DISTINCT ON), an upsert before a
// tombstone of the same version; then the moved or unmoved ones are taken.
//
// Unknown columns (_cdc_unknown): a column named in the staged row's _cdc_unknown keeps the
// target's value and stays unknown only if it was unknown before too; for moved rows (moved =
// true) the target row belongs to another incarnation of the key, so the column is written as
// staged (NULL) and stays unknown. A snapshot row (seq 0, a backfill) that is older than a live
// target row with unknown columns fills just those columns and changes nothing else: the stream
// left them unchanged since before the snapshot, so the snapshot holds their value (docs/design.md,
// "The version rule").
func upsertSQL(t changebatch.Table, src source, moved bool) (string, []any) {
	u := upsertOf(t, src, moved)
	return "insert into " + t.Quoted() + " as tgt (" + u.cols + ")\n" +
		"select " + u.cols + " from (" + newestSQL(u.cols, u.keyList, u.from) + ") as newest\n" +
		"where " + qMoved + " = $3\n" + u.onConflict, u.args
}

// upsert holds the parts of a guarded merge (upsertSQL): the staged columns, the key columns
// (quoted, comma-separated), the FROM item of the staged rows (aliased stg), the ON CONFLICT
// clause and the statement's arguments ($1 schema, $2 table name, $3 moved, then those of the
// columns and of the FROM item).
type upsert struct {
	cols, keyList, from, onConflict string
	args                            []any
}

// upsertOf returns the parts of upsertSQL(t, src, moved).
func upsertOf(t changebatch.Table, src source, moved bool) upsert {
	cols := strings.Join(copyColumns(t), ", ")
	args := []any{t.Schema, t.Name, moved}
	newer := "(tgt." + qLSN + ", tgt." + qSeq + ") < (excluded." + qLSN + ", excluded." + qSeq + ")"
	// A streamed transaction's rows staged ahead carry every value (EncodeStreamedRows) and a
	// version above the snapshots': each column is written as staged, as a moved row's are.
	whole := moved || src.streamed != nil
	// ifNewer keeps the target's value of column q when the staged row only fills unknown columns.
	ifNewer := func(q, expr string) string {
		if whole {
			return q + " = " + expr
		}
		return q + " = case when " + newer + " then " + expr + " else tgt." + q + " end"
	}
	var keys, sets []string
	for _, c := range t.Columns {
		q := pgx.Identifier{c.Name}.Sanitize()
		if c.Key {
			// Equal keys may be spelled differently (numeric 1.0 and 1.00): keep the newest spelling.
			keys = append(keys, q)
			sets = append(sets, ifNewer(q, "excluded."+q))
			continue
		}
		if whole {
			sets = append(sets, q+" = excluded."+q)
			continue
		}
		args = append(args, c.Name)
		p := "$" + strconv.Itoa(len(args)) + "::text"
		sets = append(sets, q+" = case when "+newer+" then case when "+p+" = any (excluded."+qUnknown+") then tgt."+q+" else excluded."+q+" end"+
			" when "+p+" = any (tgt."+qUnknown+") then excluded."+q+" else tgt."+q+" end")
	}
	unknown := qUnknown + " = excluded." + qUnknown
	if !whole {
		unknown = qUnknown + " = case when not " + newer + " then null when excluded." + qUnknown + " is null then null when tgt." + qDeleted + " then excluded." + qUnknown +
			" else nullif(array(select unnest(excluded." + qUnknown + ") intersect select unnest(tgt." + qUnknown + ")), '{}') end"
	}
	sets = append(sets, ifNewer(qLSN, "excluded."+qLSN), ifNewer(qSeq, "excluded."+qSeq), ifNewer(qDeleted, "excluded."+qDeleted), unknown)
	keyList := strings.Join(keys, ", ")
	from, args := src.from(args)
	onConflict := "on conflict (" + keyList + ") do update set\n  " + strings.Join(sets, ",\n  ") + "\nwhere " + newer
	if !whole {
		onConflict += "\n  or (excluded." + qSeq + " = 0 and not excluded." + qDeleted + " and not tgt." + qDeleted + " and tgt." + qUnknown + " is not null)"
	}
	return upsert{cols: cols, keyList: keyList, from: from, onConflict: onConflict, args: args}
}

// newestSQL returns the query of the newest staged row of each key (keyList) of from (aliased
// stg) above the table's TRUNCATE fence ($1 schema, $2 table name): the staged columns cols and
// _cdc_moved.
func newestSQL(cols, keyList, from string) string {
	return "select distinct on (" + keyList + ") " + cols + ", " + qMoved + " from " + from + "\n" +
		"  where " + aboveFenceSQL + "\n" +
		"  order by " + keyList + ", stg." + qLSN + " desc, stg." + qSeq + " desc, stg." + qDeleted
}

// aboveFenceSQL is the condition that staged row stg's version is above its table's TRUNCATE
// fence ($1 schema, $2 table name).
var aboveFenceSQL = "not exists (select 1 from pgconverge.tables as f where f.schema_name = $1 and f.table_name = $2" +
	" and (f.fence_lsn, f.fence_seq) >= (stg." + qLSN + ", stg." + qSeq + "))"

// lookupSQL returns the query for the non-key columns (as text), _cdc_unknown and version of the
// live target row with key $1..$k (text, cast to the key types) and a version in
// [($k+3, $k+4), ($k+1, $k+2)).
func lookupSQL(t changebatch.Table) string {
	var cols, conds []string
	n := 0
	for _, c := range t.Columns {
		q := pgx.Identifier{c.Name}.Sanitize()
		if c.Key {
			n++
			conds = append(conds, q+" = cast($"+strconv.Itoa(n)+"::text as "+c.Type+")")
		} else {
			cols = append(cols, q+"::text")
		}
	}
	conds = append(conds, "not "+qDeleted,
		"("+qLSN+", "+qSeq+") < ($"+strconv.Itoa(n+1)+"::pg_lsn, $"+strconv.Itoa(n+2)+")",
		"("+qLSN+", "+qSeq+") >= ($"+strconv.Itoa(n+3)+"::pg_lsn, $"+strconv.Itoa(n+4)+")")
	cols = append(cols, "coalesce("+qUnknown+", '{}')", qLSN+"::text", qSeq)
	return "select " + strings.Join(cols, ", ") + " from " + t.Quoted() +
		" where " + strings.Join(conds, " and ")
}

// tombstoneBeforeSQL returns the statement that turns every live row older than the version
// ($1 LSN, $2 seq) into a tombstone at that version.
func tombstoneBeforeSQL(t changebatch.Table) string {
	return "update " + t.Quoted() + " set " + qDeleted + " = true, " + qLSN + " = $1::pg_lsn, " + qSeq + " = $2, " +
		qUnknown + " = null where not " + qDeleted + " and (" + qLSN + ", " + qSeq + ") < ($1::pg_lsn, $2)"
}

// fenceSQL raises a table's TRUNCATE fence to ($3 LSN, $4 seq); it never lowers it.
const fenceSQL = `insert into pgconverge.tables as t (schema_name, table_name, fence_lsn, fence_seq)
values ($1, $2, $3::pg_lsn, $4)
on conflict (schema_name, table_name) do update set fence_lsn = excluded.fence_lsn, fence_seq = excluded.fence_seq
where (t.fence_lsn, t.fence_seq) < (excluded.fence_lsn, excluded.fence_seq)`
