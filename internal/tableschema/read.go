package tableschema

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// Schema is what one database's catalogs say of table Table. Objects are in catalog order
// (columns by attnum, the rest by name). Columns and objects named _cdc_…, and constraints and
// indexes over them, are pgconverge's metadata and left out.
type Schema struct {
	Table   changebatch.TableName
	Comment string
	Columns []Column
	// Constraints are the table's primary key, unique, check, foreign-key and exclusion
	// constraints (pg_constraint.contype p, u, c, f, x); NOT NULL is a property of Column.
	Constraints []Constraint
	// Indexes are the indexes no constraint owns (a key's or unique constraint's index is the
	// constraint's).
	Indexes  []Index
	Triggers []Trigger
	// Replicated is set when the table has pgconverge's _cdc_ columns: a target table it still
	// replicates into.
	Replicated bool
	// Owner is the table's owner; Grants the privileges the table's ACL gives other roles than
	// the owner (the owner's own are implied), by grantee and privilege.
	Owner  string
	Grants []Grant
	// PartitionKey is a partitioned table's key as pg_get_partkeydef prints it ("RANGE (at)"),
	// "" for a plain table; Partitions its tree below it.
	PartitionKey string
	Partitions   []Partition
	// oid is the table's, on the side it was read.
	oid uint32
}

// Grant is one privilege on a table given to Grantee ("PUBLIC" for every role), as aclexplode
// reads it from the table's ACL.
type Grant struct {
	Grantee, Privilege string
	Grantable          bool
}

// Column is one column: its type as format_type prints it, NOT NULL, its default expression
// (pg_get_expr, "" for none), identity ('a' ALWAYS, 'd' BY DEFAULT, 0 none) with the identity
// sequence's options, a stored generated column's expression, and its comment.
type Column struct {
	Name, Type string
	NotNull    bool
	Default    string
	Identity   byte
	// IdentitySequence is the identity's sequence, schema-qualified and quoted, and its options
	// as CREATE SEQUENCE spells them; empty without an identity.
	IdentitySequence, IdentityOptions string
	Generated                         string
	Comment                           string
}

// Constraint is a table constraint: its kind (pg_constraint.contype) and its definition as
// pg_get_constraintdef prints it, for example "FOREIGN KEY (a) REFERENCES s.t(id)".
type Constraint struct {
	Name      string
	Kind      byte
	Def       string
	Validated bool
	// index is the CREATE INDEX statement of a key's, unique or exclusion constraint's index,
	// and quoted its name as quote_ident spells it there ("" for other kinds).
	index, quoted string
}

// Index is an index no constraint owns, with its CREATE INDEX statement (pg_get_indexdef).
type Index struct {
	Name, Def string
	Unique    bool
	// quoted is Name as quote_ident spells it in Def.
	quoted string
}

// Trigger is a user trigger (not an internal one, such as a foreign key's), with its CREATE
// TRIGGER statement (pg_get_triggerdef) and its firing state (pg_trigger.tgenabled: 'O' origin
// and local, 'D' disabled, 'R' replica, 'A' always).
type Trigger struct {
	Name, Def string
	Enabled   byte
}

// Querier is what Read needs of a connection: *pgx.Conn and pgx.Tx have it.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// ErrNoTable is wrapped by Read's error when the table does not exist.
var ErrNoTable = errors.New("table does not exist")

// Read returns table t's schema on conn. A missing table's error wraps ErrNoTable.
func Read(ctx context.Context, conn Querier, t changebatch.TableName) (Schema, error) {
	s := Schema{Table: t}
	var oid *uint32
	if err := conn.QueryRow(ctx, `select to_regclass($1)::oid`, t.Quoted()).Scan(&oid); err != nil {
		return s, fmt.Errorf("look up table %s: %w", t, err)
	}
	if oid == nil {
		return s, fmt.Errorf("%w: %s", ErrNoTable, t)
	}
	s.oid = *oid
	steps := []func(context.Context, Querier, uint32, *Schema) error{readColumns, readConstraints, readIndexes, readTriggers, readGrants, readPartitions}
	for _, step := range steps {
		if err := step(ctx, conn, *oid, &s); err != nil {
			return s, fmt.Errorf("read the schema of table %s: %w", t, err)
		}
	}
	return s, nil
}

// metadata reports whether name is one of pgconverge's (a column _cdc_…) or a definition uses one.
func metadata(s string) bool { return strings.Contains(s, "_cdc_") }

func readColumns(ctx context.Context, conn Querier, oid uint32, s *Schema) error {
	if err := conn.QueryRow(ctx, `select coalesce(obj_description($1, 'pg_class'), '')`, oid).Scan(&s.Comment); err != nil {
		return err
	}
	rows, err := conn.Query(ctx, `select a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull,
  case when a.attgenerated = '' then coalesce(pg_get_expr(d.adbin, d.adrelid), '') else '' end,
  a.attidentity::text,
  case when a.attgenerated <> '' then coalesce(pg_get_expr(d.adbin, d.adrelid), '') else '' end,
  coalesce(col_description(a.attrelid, a.attnum), ''),
  coalesce(q.seq, ''),
  coalesce(format('start with %s increment by %s minvalue %s maxvalue %s cache %s %s', q.seqstart, q.seqincrement,
    q.seqmin, q.seqmax, q.seqcache, case when q.seqcycle then 'cycle' else 'no cycle' end), '')
from pg_attribute a
left join pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
left join lateral (
  select format('%I.%I', n.nspname, c.relname) as seq, ps.* from pg_depend dep
  join pg_class c on c.oid = dep.objid and c.relkind = 'S'
  join pg_namespace n on n.oid = c.relnamespace
  join pg_sequence ps on ps.seqrelid = c.oid
  where a.attidentity <> '' and dep.classid = 'pg_class'::regclass and dep.refclassid = 'pg_class'::regclass
    and dep.refobjid = a.attrelid and dep.refobjsubid = a.attnum and dep.deptype = 'i') q on true
where a.attrelid = $1 and a.attnum > 0 and not a.attisdropped
order by a.attnum`, oid)
	if err != nil {
		return err
	}
	cols, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Column, error) {
		var c Column
		var identity string
		err := r.Scan(&c.Name, &c.Type, &c.NotNull, &c.Default, &identity, &c.Generated, &c.Comment, &c.IdentitySequence, &c.IdentityOptions)
		if identity != "" {
			c.Identity = identity[0]
		} else {
			c.IdentitySequence, c.IdentityOptions = "", ""
		}
		return c, err
	})
	if err != nil {
		return err
	}
	for _, c := range cols {
		if metadata(c.Name) {
			s.Replicated = true
		} else {
			s.Columns = append(s.Columns, c)
		}
	}
	return nil
}

func readConstraints(ctx context.Context, conn Querier, oid uint32, s *Schema) error {
	rows, err := conn.Query(ctx, `select conname::text, contype::text, pg_get_constraintdef(k.oid), convalidated,
  case when contype in ('p', 'u', 'x') then pg_get_indexdef(conindid) else '' end, coalesce(quote_ident(i.relname), '')
from pg_constraint k left join pg_class i on i.oid = k.conindid and k.contype in ('p', 'u', 'x')
where conrelid = $1 and contype in ('p', 'u', 'c', 'f', 'x') order by conname`, oid)
	if err != nil {
		return err
	}
	cons, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Constraint, error) {
		var c Constraint
		var kind string
		err := r.Scan(&c.Name, &kind, &c.Def, &c.Validated, &c.index, &c.quoted)
		c.Kind = kind[0]
		return c, err
	})
	if err != nil {
		return err
	}
	for _, c := range cons {
		if !metadata(c.Def) {
			s.Constraints = append(s.Constraints, c)
		}
	}
	return nil
}

func readIndexes(ctx context.Context, conn Querier, oid uint32, s *Schema) error {
	rows, err := conn.Query(ctx, `select c.relname::text, pg_get_indexdef(i.indexrelid), i.indisunique, quote_ident(c.relname)
from pg_index i join pg_class c on c.oid = i.indexrelid
where i.indrelid = $1 and not exists (
  select 1 from pg_constraint k where k.conrelid = i.indrelid and k.conindid = i.indexrelid and k.contype in ('p', 'u', 'x'))
order by 1`, oid)
	if err != nil {
		return err
	}
	idx, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Index, error) {
		var i Index
		err := r.Scan(&i.Name, &i.Def, &i.Unique, &i.quoted)
		return i, err
	})
	if err != nil {
		return err
	}
	for _, i := range idx {
		// A partitioned table's index is printed ON ONLY (its partitions' are attached to it);
		// the target table it replicates into is one plain table.
		i.Def = strings.Replace(i.Def, " ON ONLY ", " ON ", 1)
		if !metadata(i.Def) {
			s.Indexes = append(s.Indexes, i)
		}
	}
	return nil
}

func readTriggers(ctx context.Context, conn Querier, oid uint32, s *Schema) error {
	rows, err := conn.Query(ctx, `select tgname::text, pg_get_triggerdef(oid), tgenabled::text
from pg_trigger where tgrelid = $1 and not tgisinternal order by 1`, oid)
	if err != nil {
		return err
	}
	s.Triggers, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Trigger, error) {
		var t Trigger
		var enabled string
		err := r.Scan(&t.Name, &t.Def, &enabled)
		t.Enabled = enabled[0]
		return t, err
	})
	return err
}

func readGrants(ctx context.Context, conn Querier, oid uint32, s *Schema) error {
	if err := conn.QueryRow(ctx, `select pg_get_userbyid(relowner)::text from pg_class where oid = $1`, oid).Scan(&s.Owner); err != nil {
		return err
	}
	rows, err := conn.Query(ctx, `select case when a.grantee = 0 then 'PUBLIC' else pg_get_userbyid(a.grantee)::text end, a.privilege_type, a.is_grantable
from pg_class c cross join lateral aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a
where c.oid = $1 and a.grantee <> c.relowner order by 1, 2`, oid)
	if err != nil {
		return err
	}
	s.Grants, err = pgx.CollectRows(rows, pgx.RowToStructByPos[Grant])
	return err
}
