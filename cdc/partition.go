package cdc

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// Partitioned tables (PostgreSQL docs §5.11) are replicated as one table: the publication must
// then publish their partitions' changes under the partitioned table's own name
// (publish_via_partition_root, CREATE PUBLICATION). Their leaf partitions are never selected next
// to them, so no row is replicated twice.

// partitionSet is SQL for a partitioned table's partitions (recursively, through sub-partitioned
// ones) as "oid.relfilenode.inherits-xmin" items in oid order, given the table's oid as c.oid; ""
// when it has none. It takes no lock. Any ATTACH, DETACH, CREATE or DROP of a partition changes
// it, also a DETACH and ATTACH again of the same partition (changes made to it while detached
// are not published via the root): that writes a new pg_inherits row. So does a TRUNCATE (or
// other rewrite) of a partition, which publish_via_partition_root does not publish when it is run
// on the partition alone. A catalog change that keeps both (GRANT, COMMENT, ALTER TABLE … SET
// (fillfactor …), ANALYZE) leaves it as it was: the partition's rows and their publication did not
// change.
const partitionSet = `coalesce((with recursive tree (oid, ix) as (
    select c.oid, '0'::text union all select i.inhrelid, i.xmin::text from pg_inherits i join tree on i.inhparent = tree.oid)
  select string_agg(l.oid || '.' || l.relfilenode || '.' || tree.ix, ',' order by l.oid)
  from tree join pg_class l on l.oid = tree.oid where l.oid <> c.oid), '')`

// checkPartitions reports, one error per table, the selected tables that publication name cannot
// carry as selected: a partitioned table when the publication does not publish via the partition
// root (its changes would arrive under its partitions' names), and a partition when it does (its
// changes arrive under its root's name). viaRoot is the publication's publish_via_partition_root,
// or what pgconverge would create it with.
func checkPartitions(ctx context.Context, conn *pgx.Conn, name string, viaRoot bool, tables []changebatch.TableName) ([]error, error) {
	var errs []error
	for _, t := range tables {
		kind, partition, err := relationKind(ctx, conn, t)
		if err != nil {
			return nil, err
		}
		switch {
		case viaRoot && partition:
			errs = append(errs, fmt.Errorf("publication %q has publish_via_partition_root = true, so the changes of partition %s are published as changes of its root and never under its own name: select the root table instead, or use another --publication",
				name, t))
		case !viaRoot && kind == "p":
			errs = append(errs, fmt.Errorf("publication %q has publish_via_partition_root = false, so the changes of partitioned table %s are published under its partitions' names, never its own: run ALTER PUBLICATION %s SET (publish_via_partition_root = true) (every table of the publication is then loaded again), select the partitions instead, or use another --publication",
				name, t, pgx.Identifier{name}.Sanitize()))
		}
	}
	return errs, nil
}

// anyPartitioned reports whether one of tables is a partitioned table.
func anyPartitioned(ctx context.Context, conn *pgx.Conn, tables []changebatch.TableName) (bool, error) {
	for _, t := range tables {
		kind, _, err := relationKind(ctx, conn, t)
		if err != nil || kind == "p" {
			return kind == "p", err
		}
	}
	return false, nil
}

// relationKind returns table t's relkind and whether it is a partition.
func relationKind(ctx context.Context, conn *pgx.Conn, t changebatch.TableName) (string, bool, error) {
	var kind string
	var partition bool
	err := conn.QueryRow(ctx, `select relkind::text, relispartition from pg_class where oid = $1::regclass`, t.Quoted()).Scan(&kind, &partition)
	if err != nil {
		return "", false, fmt.Errorf("read source table %s: %w", t, err)
	}
	return kind, partition, nil
}

// checkLeaves returns an error naming the first leaf partition of partitioned table t (oid) that
// is not an ordinary table: a foreign table's rows are not in the source's WAL, so its changes
// would never reach the target.
func checkLeaves(ctx context.Context, conn *pgx.Conn, t changebatch.TableName, oid uint32) error {
	var leaf *string
	err := conn.QueryRow(ctx, `with recursive tree (oid) as (
  select $1::oid union all select i.inhrelid from pg_inherits i join tree on i.inhparent = tree.oid)
select min(l.oid::regclass::text) from tree join pg_class l on l.oid = tree.oid where l.relkind not in ('p', 'r')`, oid).Scan(&leaf)
	if err != nil {
		return fmt.Errorf("read the partitions of source table %s: %w", t, err)
	}
	if leaf != nil {
		return fmt.Errorf("partitioned source table %s has partition %s, which is not an ordinary table (a foreign table): its changes are not in the source's WAL and cannot be replicated; detach it, or select the other partitions instead", t, *leaf)
	}
	return nil
}

// PartitionedTables returns the source's partitioned tables (relkind p), in one catalog read.
func PartitionedTables(ctx context.Context, conn *pgx.Conn) (map[changebatch.TableName]bool, error) {
	rows, err := conn.Query(ctx, `select n.nspname::text, c.relname::text from pg_class c join pg_namespace n on n.oid = c.relnamespace where c.relkind = 'p'`)
	if err != nil {
		return nil, fmt.Errorf("list the source's partitioned tables: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowToStructByPos[changebatch.TableName])
	if err != nil {
		return nil, fmt.Errorf("list the source's partitioned tables: %w", err)
	}
	out := map[changebatch.TableName]bool{}
	for _, n := range names {
		out[n] = true
	}
	return out, nil
}
