package apply

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// pruneBlocks is how many heap blocks of a target table one pruning transaction scans (8 KiB
// each: 64 MiB), so that no transaction holds many rows' locks for long.
const pruneBlocks = 8192

// PruneTombstones deletes the tombstones of target table t at or below fence, a version the
// table's fence was raised to already (Tx.RaiseFence, committed): no change at or below it is
// ever written again, so they guard against nothing. For a table without a key
// (changebatch.Table.Keyless) it deletes the entries deleted at or below fence, phantoms
// included. It scans the table once, pruneBlocks heap blocks per transaction (a TID range scan),
// and returns how many rows it deleted. The stream and backfills may write meanwhile: what they
// write is newer than fence.
func PruneTombstones(ctx context.Context, conn *pgx.Conn, t changebatch.Table, fence changebatch.Version) (int64, error) {
	var blocks int64
	if err := conn.QueryRow(ctx, `select pg_relation_size($1::regclass) / current_setting('block_size')::int`, t.Quoted()).Scan(&blocks); err != nil {
		return 0, fmt.Errorf("read the size of target table %s: %w", t, err)
	}
	version := qLSN + ", " + qSeq
	if t.Keyless {
		version = pgx.Identifier{changebatch.ColDeletedLSN}.Sanitize() + ", " + pgx.Identifier{changebatch.ColDeletedSeq}.Sanitize()
	}
	sql := "delete from " + t.Quoted() + " where ctid >= format('(%s,0)', $1::bigint)::tid and ctid < format('(%s,0)', $2::bigint)::tid and " +
		qDeleted + " and (" + version + ") <= ($3::pg_lsn, $4)"
	var deleted int64
	// Rows appended meanwhile land in new blocks; they are newer than fence.
	for from := int64(0); from < blocks; from += pruneBlocks {
		tag, err := conn.Exec(ctx, sql, from, from+pruneBlocks, fence.LSN.String(), int64(fence.Seq))
		if err != nil {
			return deleted, fmt.Errorf("delete tombstones of %s at or below %s: %w", t, fence, err)
		}
		deleted += tag.RowsAffected()
	}
	return deleted, nil
}
