package backfill

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// checkPartitionsUnchanged is checkNotRewritten for partitioned table t: it locks t and its
// partitions against rewrites for the rest of tx (ACCESS SHARE) and returns an error wrapping
// ErrRewritten when the leaf partitions the snapshot's catalog shows are not the ones the table
// has now (a partition was attached, detached, created or dropped: a read would scan the current
// partitions with the old snapshot, and show rows the table did not have at the snapshot, or miss
// rows it had), or when one of them was rewritten or truncated.
//
// ATTACH PARTITION does not wait for the lock (it takes SHARE UPDATE EXCLUSIVE on the table), so
// a read checks again after it read its rows (ReadChunk): one that may have scanned a partition
// attached in between stops too.
func checkPartitionsUnchanged(ctx context.Context, tx pgx.Tx, t changebatch.Table, snap Snapshot) error {
	if _, err := tx.Exec(ctx, "lock table "+t.Quoted()+" in access share mode"); err != nil {
		return fmt.Errorf("lock %s for reading: %w", t, err)
	}
	// pg_inherits and pg_class read in SQL show the snapshot's catalog; pg_partition_tree and
	// pg_relation_filenode read the current one.
	var changed, rewritten int64
	err := tx.QueryRow(ctx, `with recursive tree (oid) as (
  select $1::regclass::oid union all select i.inhrelid from pg_inherits i join tree on i.inhparent = tree.oid),
snap as (select c.oid, c.relfilenode from tree join pg_class c on c.oid = tree.oid where c.relkind <> 'p'),
cur as (select relid::oid as oid from pg_partition_tree($1::regclass) where isleaf)
select (select count(*) from snap full join cur using (oid) where snap.oid is null or cur.oid is null),
  (select count(*) from snap where relfilenode is distinct from pg_relation_filenode(oid))`, t.Quoted()).Scan(&changed, &rewritten)
	if err != nil {
		return fmt.Errorf("check the partitions of %s: %w", t, err)
	}
	if changed > 0 {
		return fmt.Errorf("%w: the partitions of %s changed on the source after snapshot %s (ATTACH, DETACH, CREATE or DROP of a partition), so the snapshot cannot show the table's rows; run the backfill again: it starts the table over from a new snapshot",
			ErrRewritten, t, snap.LSN)
	}
	if rewritten > 0 {
		return fmt.Errorf("%w: a partition of %s was rewritten or truncated on the source after snapshot %s (ALTER TABLE that rewrites it, TRUNCATE, VACUUM FULL or CLUSTER), so the snapshot cannot show its rows; run the backfill again: it starts the table over from a new snapshot",
			ErrRewritten, t, snap.LSN)
	}
	return nil
}
