package backfill

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// CopyChunk reads the rows of chunk c of keyed table t that snapshot snap shows, as ReadChunk
// does (same transaction, checks and order), but writes them to w as the source's own COPY
// output, t's columns in t.Columns order: in text format (PostgreSQL docs, COPY, "Text Format"),
// one line per row, values as the source prints them, no header and no end marker; or, when
// binary is true, in binary format ("Binary Format"), header and trailer included. The bytes pass
// through unparsed, for a target COPY of the same columns. It returns the number of rows the
// source sent; an error of w ends the read with that error.
func CopyChunk(ctx context.Context, conn *pgx.Conn, snap Snapshot, t changebatch.Table, c Chunk, binary bool, w io.Writer) (int64, error) {
	if t.Keyless {
		return 0, fmt.Errorf("copy a chunk of %s: it has no key to read in order (ReadChunk)", t)
	}
	tx, err := beginChunk(ctx, conn, snap, t, c)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// COPY takes no parameters: the bounds are written as literals.
	cond := boundsCondition(t, c, changebatch.QuoteLiteral)
	sql := "copy (" + chunkQuery(t, cond, c) + ") to stdout"
	if binary {
		sql += " with (format binary)"
	}
	tag, err := tx.Conn().PgConn().CopyTo(ctx, w, sql)
	if err != nil {
		return 0, fmt.Errorf("read chunk %s of %s at snapshot %s: %w", c, t, snap.LSN, err)
	}
	if t.Partitioned {
		// A partition attached after the first check may have been scanned.
		if err := checkPartitionsUnchanged(ctx, tx, t, snap); err != nil {
			return 0, err
		}
	}
	return tag.RowsAffected(), nil
}

// chunkQuery returns the read of keyed table t's rows of chunk c that satisfy cond (over the key
// columns), in key order, at most c.Limit of them when it is set; for a block chunk in the order
// stored.
func chunkQuery(t changebatch.Table, cond string, c Chunk) string {
	cols := make([]string, len(t.Columns))
	for i, col := range t.Columns {
		cols[i] = pgx.Identifier{col.Name}.Sanitize()
	}
	q := "select " + strings.Join(cols, ", ") + " from " + t.SourceRelation("s") + " where " + cond
	if c.ByBlock {
		return q
	}
	names, _ := keyColumns(t)
	q += " order by " + strings.Join(names, ", ")
	if c.Limit > 0 {
		q += " limit " + strconv.Itoa(c.Limit)
	}
	return q
}
