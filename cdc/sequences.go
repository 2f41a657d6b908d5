package cdc

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// pgoutput in PostgreSQL 15 carries no sequence changes, so sequences are read from the source's
// catalog and relations directly (PostgreSQL docs §9.17 "Sequence Manipulation Functions",
// CREATE SEQUENCE, and the pg_sequence and pg_depend catalogs, §53.47 and §53.18).

// ErrNoSourceTable is returned (wrapped) by TableSequences when the table does not exist on the
// source.
var ErrNoSourceTable = errors.New("source table does not exist")

// SequenceName is a sequence's schema-qualified name, unquoted.
type SequenceName struct{ Schema, Name string }

// String returns the name for output and map keys (changebatch.QualifiedName).
func (n SequenceName) String() string { return changebatch.QualifiedName(n.Schema, n.Name) }

// Quoted returns the name quoted for SQL.
func (n SequenceName) Quoted() string { return pgx.Identifier{n.Schema, n.Name}.Sanitize() }

// Sequence is a source sequence's definition (CREATE SEQUENCE's parameters, from pg_sequence) and
// its state as read from the sequence relation.
type Sequence struct {
	SequenceName
	// DataType is the sequence's type: smallint, integer or bigint.
	DataType string
	// Start, Increment, Min, Max and Cache are START WITH, INCREMENT BY, MINVALUE, MAXVALUE and
	// CACHE; Increment is negative for a descending sequence.
	Start, Increment, Min, Max, Cache int64
	// Cycle is CYCLE.
	Cycle bool
	// LastValue and IsCalled are the relation's last_value and is_called: with IsCalled the next
	// nextval returns LastValue+Increment, else LastValue (as setval's third argument). On a
	// primary, last_value is the last value any session took from the sequence, including values
	// a session cached (CACHE > 1) and has not used yet, and values of rolled-back transactions,
	// since nextval is never rolled back.
	LastValue int64
	IsCalled  bool
}

// CheckSequenceSource refuses a source that is a standby (pg_is_in_recovery): a standby's
// sequences show only what the primary WAL-logged, and lag the primary by the replication delay.
func CheckSequenceSource(ctx context.Context, conn *pgx.Conn) error {
	var standby bool
	if err := conn.QueryRow(ctx, `select pg_is_in_recovery()`).Scan(&standby); err != nil {
		return fmt.Errorf("read source recovery state: %w", err)
	}
	if standby {
		return errors.New("the source is a standby (pg_is_in_recovery): its sequence values lag the primary's; read them on the primary: point pgconverge sequences --source at it (cutover, backfill --sync-sequences and run --sync-sequences do so themselves when --primary is set)")
	}
	return nil
}

// TableSequences returns the sequences table t uses on the source, ordered by name: those owned
// by its columns (serial and identity columns: pg_depend deptype 'a' or 'i') and those its column
// defaults reference as nextval('name') (a dependency of the pg_attrdef row on the sequence). A
// default that names its sequence as text (nextval('name'::text)) has no dependency and is not
// found. A missing table returns an error wrapping ErrNoSourceTable.
func TableSequences(ctx context.Context, conn *pgx.Conn, t changebatch.TableName) ([]SequenceName, error) {
	var oid *uint32
	if err := conn.QueryRow(ctx, `select to_regclass($1)::oid`, t.Quoted()).Scan(&oid); err != nil {
		return nil, fmt.Errorf("look up source table %s: %w", t, err)
	}
	if oid == nil {
		return nil, fmt.Errorf("%w: %s (schema.table; unquoted names fold to lower case, as in SQL)", ErrNoSourceTable, t)
	}
	rows, err := conn.Query(ctx, `with used (seq) as (
  select d.objid from pg_depend d
  where d.classid = 'pg_class'::regclass and d.refclassid = 'pg_class'::regclass and d.refobjid = $1
    and d.deptype in ('a', 'i')
  union
  select d.refobjid from pg_attrdef ad
  join pg_depend d on d.classid = 'pg_attrdef'::regclass and d.objid = ad.oid and d.refclassid = 'pg_class'::regclass
  where ad.adrelid = $1)
select n.nspname::text, c.relname::text from used u
join pg_class c on c.oid = u.seq and c.relkind = 'S'
join pg_namespace n on n.oid = c.relnamespace
order by 1, 2`, *oid)
	if err != nil {
		return nil, fmt.Errorf("list sequences of source table %s: %w", t, err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowToStructByPos[SequenceName])
	if err != nil {
		return nil, fmt.Errorf("list sequences of source table %s: %w", t, err)
	}
	return names, nil
}

// ReadSequence reads sequence n's definition and state on the source. The state is read outside
// any snapshot (sequences are not transactional), so it is the newest. It needs SELECT on the
// sequence (and USAGE on its schema); without it the error names the GRANT to run.
func ReadSequence(ctx context.Context, conn *pgx.Conn, n SequenceName) (Sequence, error) {
	s := Sequence{SequenceName: n}
	var canRead, schemaUsage bool
	err := conn.QueryRow(ctx, `select format_type(s.seqtypid, null), s.seqstart, s.seqincrement, s.seqmin, s.seqmax,
  s.seqcache, s.seqcycle, has_sequence_privilege(c.oid, 'SELECT'), has_schema_privilege(c.relnamespace, 'USAGE')
from pg_sequence s join pg_class c on c.oid = s.seqrelid join pg_namespace ns on ns.oid = c.relnamespace
where ns.nspname = $1 and c.relname = $2`, n.Schema, n.Name).Scan(&s.DataType, &s.Start, &s.Increment, &s.Min, &s.Max,
		&s.Cache, &s.Cycle, &canRead, &schemaUsage)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, fmt.Errorf("source sequence %s does not exist (dropped while being read?)", n)
	}
	if err != nil {
		return s, fmt.Errorf("read source sequence %s: %w", n, err)
	}
	if !canRead || !schemaUsage {
		return s, fmt.Errorf("source role may not read sequence %s: run GRANT USAGE ON SCHEMA %s TO <role>; GRANT SELECT ON SEQUENCE %s TO <role> on the source",
			n, pgx.Identifier{n.Schema}.Sanitize(), n.Quoted())
	}
	if err := conn.QueryRow(ctx, `select last_value, is_called from `+n.Quoted()).Scan(&s.LastValue, &s.IsCalled); err != nil {
		return s, fmt.Errorf("read value of source sequence %s: %w", n, err)
	}
	return s, nil
}
