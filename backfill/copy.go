package backfill

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// CopyChunk reads the rows of chunk c of keyed table t that snapshot snap shows, as ReadChunk
// does (same transaction, checks and key order), but writes them to w as the source's own COPY
// output in text format (PostgreSQL docs, COPY, "Text Format"): one line per row, t's columns in
// t.Columns order, values as the source prints them, no header and no end marker. The bytes pass
// through unparsed, for a target COPY of the same columns. It returns the number of rows the
// source sent; an error of w ends the read with that error.
func CopyChunk(ctx context.Context, conn *pgx.Conn, snap Snapshot, t changebatch.Table, c Chunk, w io.Writer) (int64, error) {
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
	tag, err := tx.Conn().PgConn().CopyTo(ctx, w, "copy ("+chunkQuery(t, cond)+") to stdout")
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

// chunkQuery returns the read of keyed table t's rows that satisfy cond (over the key columns),
// in key order.
func chunkQuery(t changebatch.Table, cond string) string {
	cols := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		cols[i] = pgx.Identifier{c.Name}.Sanitize()
	}
	names, _ := keyColumns(t)
	return "select " + strings.Join(cols, ", ") + " from " + t.SourceRelation("s") + " where " + cond +
		" order by " + strings.Join(names, ", ")
}
