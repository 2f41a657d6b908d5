package tableschema

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Partition is one table of a partitioned table's tree, below its root: Name and Parent
// schema-qualified and quoted, Bound as pg_get_expr prints its relpartbound ("FOR VALUES IN
// ('eu')", "DEFAULT"), and Key, pg_get_partkeydef's "LIST (region)" when it is partitioned in
// turn ("" for a leaf).
type Partition struct {
	Name, Parent, Bound, Key string
}

// readPartitions sets s.PartitionKey and s.Partitions when table oid is partitioned: its tree
// (pg_partition_tree) below the root, parents before their partitions.
func readPartitions(ctx context.Context, conn Querier, oid uint32, s *Schema) error {
	if err := conn.QueryRow(ctx, `select coalesce(pg_get_partkeydef($1), '')`, oid).Scan(&s.PartitionKey); err != nil || s.PartitionKey == "" {
		return err
	}
	rows, err := conn.Query(ctx, `select format('%I.%I', n.nspname, c.relname), format('%I.%I', pn.nspname, p.relname),
  pg_get_expr(c.relpartbound, c.oid), coalesce(pg_get_partkeydef(c.oid), '')
from pg_partition_tree($1) t join pg_class c on c.oid = t.relid join pg_namespace n on n.oid = c.relnamespace
join pg_class p on p.oid = t.parentrelid join pg_namespace pn on pn.oid = p.relnamespace
where t.level > 0 order by t.level, 1`, oid)
	if err != nil {
		return err
	}
	s.Partitions, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Partition])
	return err
}

// partitioning compares the tables' partition layouts. A source table partitioned where the
// target's is one plain table (as pgconverge replicates it) gets the statements that rebuild the
// target's as the source's, its rows moved (Repartition runs them); a layout that differs
// otherwise is reported without a fix.
func (c *comparison) partitioning(src, tgt Schema) {
	describe := func(s Schema) string {
		if s.PartitionKey == "" {
			return ""
		}
		parts := make([]string, len(s.Partitions))
		for i, p := range s.Partitions {
			parts[i] = p.Name + " " + p.Bound
			if p.Key != "" {
				parts[i] += " PARTITION BY " + p.Key
			}
		}
		return "PARTITION BY " + s.PartitionKey + ": " + strings.Join(parts, ", ")
	}
	source, target := describe(src), describe(tgt)
	if source == target {
		return
	}
	d := Difference{Kind: KindPartitioning, Source: source, Target: target, phase: phasePartition}
	if source != "" && target == "" {
		repartition(&d, src)
	}
	if source == "" {
		d.TargetOnly = true
	}
	c.add(d)
}

// repartition sets d's Fix to the statements that turn the plain target table of partitioned
// source table s into a partitioned table of s's layout: the plain table renamed aside, the
// partitioned one created with its columns (LIKE, generated columns too) and s's partitions, the
// rows moved (slow: a rehearsal leaves it out), the plain one dropped. The rest of the table's
// objects (key, indexes, constraints) are left to compare and carry again.
func repartition(d *Difference, s Schema) {
	aside := TwinName(s.Table.Name)
	qAside := pgx.Identifier{s.Table.Schema, aside}.Sanitize()
	var cols []string
	for _, c := range s.Columns {
		if c.Generated == "" {
			cols = append(cols, q(c.Name))
		}
	}
	list := strings.Join(cols, ", ")
	d.Fix = []string{
		"alter table " + s.Table.Quoted() + " rename to " + q(aside),
		"create table " + s.Table.Quoted() + " (like " + qAside + " including generated) partition by " + s.PartitionKey,
	}
	for _, p := range s.Partitions {
		stmt := "create table " + p.Name + " partition of " + p.Parent + " " + p.Bound
		if p.Key != "" {
			stmt += " partition by " + p.Key
		}
		d.Fix = append(d.Fix, stmt)
	}
	d.fixSlowly("insert into " + s.Table.Quoted() + " (" + list + ") select " + list + " from " + qAside)
	d.Fix = append(d.Fix, "drop table "+qAside)
}

// Repartition runs, on tx, the fix of diffs' partitioning difference (Compare's, of one table:
// a partitioned source table whose target table is plain) and reports whether there was one; the
// caller then reads the table again and compares it anew (its key, indexes and constraints went
// with the plain table). A rehearsal does not move the rows. Its error names the table and the
// statement.
func Repartition(ctx context.Context, tx pgx.Tx, diffs []Difference, rehearse bool) (bool, error) {
	for _, d := range diffs {
		if d.Kind != KindPartitioning || len(d.Fix) == 0 {
			continue
		}
		for _, stmt := range d.Fix {
			if rehearse && d.slow[stmt] {
				continue
			}
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return false, fmt.Errorf("partition target table %s as on the source (%s): %w; a table of a partition's name on the target, or a view over the table, stands in its way: rename or drop it, then run cutover --finalize again",
					d.Table, stmt, err)
			}
		}
		return true, nil
	}
	return false, nil
}
