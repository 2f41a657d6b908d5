package tableschema

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// Sequence is a sequence a table uses (owned by a serial or identity column, or named by a
// column default's nextval), read by name on either side: Name schema-qualified and quoted,
// Options as CREATE SEQUENCE spells them, and its position (LastValue, nil before the first
// nextval, or when the role may not read it: pg_sequences).
type Sequence struct {
	Name, Options string
	LastValue     *int64
}

// usedSequences lists the sequences of table oid on conn: owned by its columns (pg_depend 'a'
// and 'i') or referenced by its defaults (the pg_attrdef row's dependency), by name.
const usedSequences = `with used (seq) as (
  select d.objid from pg_depend d
  where d.classid = 'pg_class'::regclass and d.refclassid = 'pg_class'::regclass and d.refobjid = $1 and d.deptype in ('a', 'i')
  union
  select d.refobjid from pg_attrdef ad
  join pg_depend d on d.classid = 'pg_attrdef'::regclass and d.objid = ad.oid and d.refclassid = 'pg_class'::regclass
  where ad.adrelid = $1)
select format('%I.%I', n.nspname, c.relname) from used u
join pg_class c on c.oid = u.seq and c.relkind = 'S' join pg_namespace n on n.oid = c.relnamespace order by 1`

// readSequence reads sequence name (quoted, qualified) on conn; ok is false when it does not
// exist.
func readSequence(ctx context.Context, conn Querier, name string) (s Sequence, ok bool, err error) {
	s.Name = name
	err = conn.QueryRow(ctx, `select format('as %s increment by %s minvalue %s maxvalue %s start with %s cache %s %s',
  format_type(s.seqtypid, null), s.seqincrement, s.seqmin, s.seqmax, s.seqstart, s.seqcache, case when s.seqcycle then 'cycle' else 'no cycle' end),
  v.last_value
from pg_sequence s join pg_class c on c.oid = s.seqrelid join pg_namespace n on n.oid = c.relnamespace
left join pg_sequences v on v.schemaname = n.nspname and v.sequencename = c.relname
where s.seqrelid = to_regclass($1)`, name).Scan(&s.Options, &s.LastValue)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, false, nil
	}
	return s, err == nil, err
}

// compareSequences reads on tgt each sequence source table t uses on src, by name, and compares
// it: missing, other options, or a position behind the source's (the target would hand out
// values the source handed out already).
func compareSequences(ctx context.Context, src, tgt Querier, t changebatch.TableName, oid uint32) ([]Difference, error) {
	rows, err := src.Query(ctx, usedSequences, oid)
	if err != nil {
		return nil, fmt.Errorf("list the sequences of %s: %w", t, err)
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		names = append(names, n)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list the sequences of %s: %w", t, err)
	}
	var out []Difference
	for _, n := range names {
		s, _, err := readSequence(ctx, src, n)
		if err != nil {
			return nil, fmt.Errorf("read source sequence %s: %w", n, err)
		}
		g, found, err := readSequence(ctx, tgt, n)
		if err != nil {
			return nil, fmt.Errorf("read target sequence %s: %w", n, err)
		}
		d := Difference{Table: t, Kind: KindSequence, Object: n, Source: s.Options, Target: g.Options, phase: phaseSequence}
		switch {
		case !found:
			d.Fix = []string{"create sequence " + n + " " + s.Options}
		case s.Options != g.Options:
			d.Fix = []string{"alter sequence " + n + " " + s.Options}
		}
		if s.LastValue != nil && (!found || g.LastValue == nil || *g.LastValue < *s.LastValue) {
			d.Source += fmt.Sprintf(", at %d", *s.LastValue)
			if g.LastValue != nil {
				d.Target += fmt.Sprintf(", at %d", *g.LastValue)
			}
			d.Fix = append(d.Fix, fmt.Sprintf("select setval(%s, %d)", changebatch.QuoteLiteral(n), *s.LastValue))
		}
		if len(d.Fix) > 0 {
			out = append(out, d)
		}
	}
	return out, nil
}
