package apply

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// The rows of a transaction the source streams before its commit, decoded and staged while it
// runs (package staging keeps them): each table's changes in a staging table of their own, with
// the columns of the session staging table (copyColumns, _cdc_moved) and the subtransaction that
// made each change. Their versions carry the change's ordinal and a placeholder LSN: the commit's
// LSN is known only at the Stream Commit, and ApplyStreamed merges them at it, so that the commit
// takes one set-based merge per table, not the decoding of every change.

// StreamedRows is the staging table of one table's changes made by one streamed transaction.
type StreamedRows struct {
	Table changebatch.Table
	// Name is the staging table, quoted and schema-qualified.
	Name string
	// Rows is how many changes it holds.
	Rows int64
	// Inserts is true when every change staged is an INSERT: no key appears twice (a key that an
	// aborted subtransaction inserted is discarded with it), so no change is folded into another.
	Inserts bool
}

// qSubXid names the staging column of the subtransaction (its xid) that made a change.
var qSubXid = pgx.Identifier{"_cdc_subxid"}.Sanitize()

// StreamedStageSQL returns the DDL of the UNLOGGED staging table name (quoted, schema-qualified)
// of tab's streamed changes, shaped after the target table as it is now.
func StreamedStageSQL(tab changebatch.Table, name string) string {
	return "create unlogged table " + name + " as select " + strings.Join(copyColumns(tab), ", ") + ", false as " + qMoved +
		", 0::bigint as " + qSubXid + " from " + tab.Quoted() + " with no data"
}

// StreamedCopySQL returns the COPY that appends EncodeStreamedRows' lines to staging table name.
func StreamedCopySQL(tab changebatch.Table, name string) string {
	return "copy " + name + " (" + strings.Join(append(copyColumns(tab), qMoved, qSubXid), ", ") + ") from stdin"
}

// DiscardStreamedSubSQL returns the DELETE of the changes subtransaction $1 staged in name.
func DiscardStreamedSubSQL(name string) string {
	return "delete from " + name + " where " + qSubXid + " = $1"
}

// EncodeStreamedRows appends rec's changes, made by subtransaction subXid, to buf as COPY text
// lines (PostgreSQL docs, COPY, "Text Format") for StreamedCopySQL, and returns how many. Every
// change must carry all its values and be an upsert or a tombstone: a TRUNCATE, or a value the
// source left out as unchanged TOAST, is an error (those take the stream's general path).
func EncodeStreamedRows(buf *bytes.Buffer, rec arrow.RecordBatch, subXid uint32) (int, error) {
	v, err := changebatch.NewView(rec)
	if err != nil {
		return 0, err
	}
	sub := "\t" + strconv.FormatUint(uint64(subXid), 10) + "\n"
	row := []stagedRow{{}}
	for i := 0; i < v.Len(); i++ {
		c := v.Change(i)
		if c.Op == changebatch.OpTruncate || anyUnchanged(c.Values) {
			return 0, fmt.Errorf("stage streamed changes of %s: change %d is a TRUNCATE or has a value the source left out as unchanged TOAST, which only the messages' path applies", v.Table, i)
		}
		row[0] = stagedRow{op: c.Op, version: c.Version, values: c.Values}
		encodeCopyText(buf, v.Table, row)
		buf.Truncate(buf.Len() - 1) // the line's newline: the subtransaction follows
		buf.WriteString(sub)
	}
	return v.Len(), nil
}

// streamedSource is the FROM item of a streamed transaction's staged changes of one table, with
// the commit's LSN as their versions' LSN.
type streamedSource struct {
	rows   StreamedRows
	commit pglogrepl.LSN
}

func (s *streamedSource) from(args []any) (string, []any) {
	args = append(args, s.commit.String())
	var cols []string
	for _, c := range s.rows.Table.Columns {
		cols = append(cols, pgx.Identifier{c.Name}.Sanitize())
	}
	return "(select " + strings.Join(cols, ", ") + ", $" + strconv.Itoa(len(args)) + "::pg_lsn as " + qLSN + ", " +
		strings.Join([]string{qSeq, qDeleted, qUnknown, qMoved}, ", ") + " from " + s.rows.Name + ") as stg", args
}

// ApplyStreamed merges the changes of a streamed transaction committed at commit, staged in
// staged (one StreamedRows per table), at versions (commit, ordinal), with the version rule of
// Apply: one guarded INSERT … ON CONFLICT per table of the newest change of each key above the
// table's fence. A table whose changes are all INSERTs (StreamedRows.Inserts) is first tried with a
// plain INSERT, twice as fast, in a savepoint; a key the target already holds (a backfill wrote it)
// fails it with a unique violation, and the guarded merge follows. It first locks the tables'
// fences and records p (as ApplyGroup does), in one round trip with the other merges. It returns
// one Result per table, in staged's order: Applied rows written, Suppressed newest changes the
// target already held at the same or a newer version, Merged changes folded into a newer change of
// their key.
func (t *Tx) ApplyStreamed(ctx context.Context, staged []StreamedRows, commit pglogrepl.LSN, p Progress) ([]Result, error) {
	tabs := make([]changebatch.Table, len(staged))
	for i, s := range staged {
		if s.Table.Keyless {
			return nil, fmt.Errorf("apply streamed changes of %s: a keyless table's changes take the stream's general path", s.Table)
		}
		tabs[i] = s.Table
	}
	b := &pgx.Batch{}
	readStart := t.queueStart(b, tabs, p)
	for _, s := range staged {
		if !s.Inserts {
			sql, args := streamedMergeSQL(s, commit)
			b.Queue(sql, args...)
		}
	}
	results := make([]Result, len(staged))
	br := t.tx.SendBatch(ctx, b)
	err := readStart(br)
	for i, s := range staged {
		if err != nil || s.Inserts {
			continue
		}
		results[i], err = streamedResult(t, s, br.QueryRow())
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	for i, s := range staged {
		if s.Inserts {
			if results[i], err = t.insertStreamed(ctx, s, commit); err != nil {
				return nil, err
			}
		}
	}
	for _, r := range results {
		t.Result.Add(r)
	}
	return results, nil
}

// streamedMergeSQL returns the guarded merge of s's newest change of each key at commit, which
// returns how many there are and how many it wrote.
func streamedMergeSQL(s StreamedRows, commit pglogrepl.LSN) (string, []any) {
	u := upsertOf(s.Table, source{streamed: &streamedSource{rows: s, commit: commit}}, false)
	return "with newest as materialized (" + newestSQL(u.cols, u.keyList, u.from) + "),\n" +
		"written as (insert into " + s.Table.Quoted() + " as tgt (" + u.cols + ")\nselect " + u.cols + " from newest where " + qMoved + " = $3\n" +
		u.onConflict + "\nreturning 1)\nselect (select count(*) from newest), (select count(*) from written)", u.args
}

// insertStreamed writes s's changes, all INSERTs, with a plain INSERT of those above the table's
// fence in a savepoint; when the target holds one of the keys, it rolls the savepoint back and
// merges them (streamedMergeSQL).
func (t *Tx) insertStreamed(ctx context.Context, s StreamedRows, commit pglogrepl.LSN) (Result, error) {
	// A table whose bulk load is under way has no primary key until the load completes
	// (bulkkey.go): a plain INSERT would not meet the keys the load writes, so the merge, which
	// then fails and is retried, is left to say so. The lock keeps the key from being dropped
	// after the look.
	if _, err := t.tx.Exec(ctx, "lock table "+s.Table.Quoted()+" in row exclusive mode"); err != nil {
		return Result{}, fmt.Errorf("lock %s: %w", s.Table, err)
	}
	var keyed bool
	if err := t.tx.QueryRow(ctx, "select exists (select 1 from pg_index where indrelid = $1::regclass and indisprimary)", s.Table.Quoted()).Scan(&keyed); err != nil {
		return Result{}, fmt.Errorf("look up the primary key of %s: %w", s.Table, err)
	}
	if !keyed {
		return t.mergeStreamed(ctx, s, commit)
	}
	cols := strings.Join(copyColumns(s.Table), ", ")
	from, args := (&streamedSource{rows: s, commit: commit}).from([]any{s.Table.Schema, s.Table.Name})
	if _, err := t.tx.Exec(ctx, "savepoint pgconverge_streamed_insert"); err != nil {
		return Result{}, err
	}
	tag, err := t.tx.Exec(ctx, "insert into "+s.Table.Quoted()+" ("+cols+")\nselect "+cols+" from "+from+"\nwhere "+aboveFenceSQL, args...)
	if err == nil {
		_, err = t.tx.Exec(ctx, "release savepoint pgconverge_streamed_insert")
		return Result{Applied: tag.RowsAffected(), Suppressed: s.Rows - tag.RowsAffected()}, err
	}
	if !pgsession.IsCode(err, pgerrcode.UniqueViolation) {
		return Result{}, upsertError(t.copyOnly(), s.Table, int(s.Rows), source{}, err)
	}
	if _, err := t.tx.Exec(ctx, "rollback to savepoint pgconverge_streamed_insert"); err != nil {
		return Result{}, err
	}
	return t.mergeStreamed(ctx, s, commit)
}

// mergeStreamed merges s's changes at commit (streamedMergeSQL) on its own.
func (t *Tx) mergeStreamed(ctx context.Context, s StreamedRows, commit pglogrepl.LSN) (Result, error) {
	sql, args := streamedMergeSQL(s, commit)
	return streamedResult(t, s, t.tx.QueryRow(ctx, sql, args...))
}

// streamedResult reads the counts streamedMergeSQL returns for s from row.
func streamedResult(t *Tx, s StreamedRows, row pgx.Row) (Result, error) {
	var newest, written int64
	if err := row.Scan(&newest, &written); err != nil {
		return Result{}, upsertError(t.copyOnly(), s.Table, int(s.Rows), source{}, err)
	}
	return Result{Applied: written, Suppressed: newest - written, Merged: max(s.Rows-newest, 0)}, nil
}
