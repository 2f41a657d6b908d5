package cdc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// PublicationExists reports whether publication name exists on the server of conn; the error
// is the catalog read's, naming the publication.
func PublicationExists(ctx context.Context, conn *pgx.Conn, name string) (bool, error) {
	var exists bool
	err := conn.QueryRow(ctx, `select exists (select 1 from pg_publication where pubname = $1)`, name).Scan(&exists)
	if err != nil {
		return false, fmt.Errorf("look up publication %q: %w", name, err)
	}
	return exists, nil
}

// CheckPublication returns, all at once, every reason EnsurePublication would refuse tables or
// fail, and writes nothing. For an existing publication: settings that would make pgconverge
// miss changes (checkPublication), and tables it lacks that the role may not add; for a missing
// one: tables a new publication could not carry as selected (checkPartitions), and the
// privileges to create it. Creating a publication FOR TABLE needs CREATE on the database and
// ownership of the tables (PostgreSQL docs, CREATE PUBLICATION); adding tables to one needs ownership of the publication and of the tables (ALTER
// PUBLICATION).
func CheckPublication(ctx context.Context, conn *pgx.Conn, name string, tables []changebatch.TableName) error {
	plan, err := planPublication(ctx, conn, name, tables)
	if err != nil {
		return err
	}
	return plan.check(ctx, conn, name)
}

// check returns the refusals of plan for publication name, and the privileges the role lacks to
// carry it out (CheckPublication).
func (plan publicationPlan) check(ctx context.Context, conn *pgx.Conn, name string) error {
	errs := plan.refusals
	if !plan.exists {
		var canCreate bool
		if err := conn.QueryRow(ctx, `select has_database_privilege(current_database(), 'CREATE')`).Scan(&canCreate); err != nil {
			return fmt.Errorf("read the source role's privileges: %w", err)
		}
		if !canCreate {
			errs = append(errs, fmt.Errorf("the source role may not create publication %q: it needs CREATE on the source database: GRANT CREATE ON DATABASE %s TO %s, or create the publication as its owner (CREATE PUBLICATION %s FOR TABLE …) and run again",
				name, pgx.Identifier{conn.Config().Database}.Sanitize(), pgx.Identifier{conn.Config().User}.Sanitize(), pgx.Identifier{name}.Sanitize()))
		}
	}
	if plan.exists && len(plan.missing) > 0 {
		var ownsPub bool
		if err := conn.QueryRow(ctx, `select pg_has_role(pubowner, 'USAGE') from pg_publication where pubname = $1`, name).Scan(&ownsPub); err != nil {
			return fmt.Errorf("read the owner of publication %q: %w", name, err)
		}
		if !ownsPub {
			errs = append(errs, fmt.Errorf("the source role may not add tables to publication %q: only its owner may: have the owner run ALTER PUBLICATION %s ADD TABLE %s, or name another --publication",
				name, pgx.Identifier{name}.Sanitize(), quotedList(plan.missing)))
		}
	}
	for _, t := range plan.missing {
		var owns bool
		if err := conn.QueryRow(ctx, `select pg_has_role(relowner, 'USAGE') from pg_class where oid = $1::regclass`, t.Quoted()).Scan(&owns); err != nil {
			return fmt.Errorf("read the owner of source table %s: %w", t, err)
		}
		if !owns {
			errs = append(errs, fmt.Errorf("the source role may not publish table %s in publication %q: only its owner may: have the owner run ALTER PUBLICATION %s ADD TABLE %s (or CREATE PUBLICATION … FOR TABLE), or GRANT the owning role to %s",
				t, name, pgx.Identifier{name}.Sanitize(), t.Quoted(), pgx.Identifier{conn.Config().User}.Sanitize()))
		}
	}
	return errors.Join(errs...)
}

// publicationPlan is what EnsurePublication would do with publication name and tables.
type publicationPlan struct {
	exists, allTables, viaRoot bool
	// missing are the tables to add (every table when the publication does not exist).
	missing []changebatch.TableName
	// refusals are the reasons the publication cannot carry tables as selected.
	refusals []error
}

// planPublication reads publication name and what it lacks of tables, writing nothing.
func planPublication(ctx context.Context, conn *pgx.Conn, name string, tables []changebatch.TableName) (publicationPlan, error) {
	var plan publicationPlan
	if err := ValidatePublicationName(name); err != nil {
		return plan, err
	}
	err := conn.QueryRow(ctx, `select puballtables from pg_publication where pubname = $1`, name).Scan(&plan.allTables)
	plan.exists = err == nil
	if err != nil && err != pgx.ErrNoRows {
		return plan, fmt.Errorf("look up publication %q: %w", name, err)
	}
	if plan.exists {
		if err := checkPublication(ctx, conn, name, tables); err != nil {
			plan.refusals = append(plan.refusals, err)
		}
	} else {
		// A new publication publishes partitioned tables under their own name when one is
		// selected; otherwise it stays as before, so that partitions can be selected.
		if plan.viaRoot, err = anyPartitioned(ctx, conn, tables); err != nil {
			return plan, err
		}
		errs, err := checkPartitions(ctx, conn, name, plan.viaRoot, tables)
		if err != nil {
			return plan, err
		}
		plan.refusals = append(plan.refusals, errs...)
	}
	if plan.exists && plan.allTables {
		return plan, nil
	}
	for _, t := range tables {
		var in bool
		if plan.exists {
			err := conn.QueryRow(ctx, `select exists (select 1 from pg_publication_tables where pubname = $1 and schemaname = $2 and tablename = $3)`,
				name, t.Schema, t.Name).Scan(&in)
			if err != nil {
				return plan, fmt.Errorf("look up publication %q: %w", name, err)
			}
		}
		if !in {
			plan.missing = append(plan.missing, t)
		}
	}
	return plan, nil
}

// PublishHooks are what EnsurePublication runs around its change of a publication.
type PublishHooks struct {
	// BeforeAdd runs with the tables about to be added, before they are: the stream never
	// carried their earlier changes, so the caller marks them for loading first and a crash in
	// between cannot hide that. Nil runs nothing.
	BeforeAdd func([]changebatch.TableName) error
	// BeforeCommit runs after the change, before the source transaction that made it commits; an
	// error rolls the change back. Nil runs nothing.
	BeforeCommit func() error
	// CommitWithin, when not 0, is how long the source waits for the commit once the change (and
	// each later statement of its transaction) ran: a commit that comes later fails, the source
	// ends the transaction's session (idle_in_transaction_session_timeout) and nothing changes.
	CommitWithin time.Duration
}

// EnsurePublication creates publication name for tables (empty when tables is), or adds to an existing publication the
// tables it lacks, in one source transaction, running hooks around the change; a publication it
// creates for a partitioned table publishes via the partition root, so that the partitions'
// changes arrive under the table's own name. It refuses what CheckPublication refuses, before it
// writes. It returns the tables it added (all of them when it created the publication).
func EnsurePublication(ctx context.Context, conn *pgx.Conn, name string, tables []changebatch.TableName, hooks PublishHooks) ([]changebatch.TableName, error) {
	plan, err := planPublication(ctx, conn, name, tables)
	if err != nil {
		return nil, err
	}
	if err := plan.check(ctx, conn, name); err != nil {
		return nil, err
	}
	missing := plan.missing
	if len(missing) == 0 && plan.exists {
		return nil, nil
	}
	list := quotedList(missing)
	if len(missing) > 0 && hooks.BeforeAdd != nil {
		if err := hooks.BeforeAdd(missing); err != nil {
			return nil, err
		}
	}
	sql := "create publication " + pgx.Identifier{name}.Sanitize() + " for table " + list
	switch {
	case plan.exists:
		sql = "alter publication " + pgx.Identifier{name}.Sanitize() + " add table " + list
	case len(missing) == 0:
		// Every selected table is kept by snapshots: START_REPLICATION still needs the
		// publication, and tables that become streamable are added to it.
		sql, list = "create publication "+pgx.Identifier{name}.Sanitize(), "no table"
	case plan.viaRoot:
		sql += " with (publish_via_partition_root = true)"
	}
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if hooks.CommitWithin > 0 {
			if _, err := tx.Exec(ctx, `select set_config('idle_in_transaction_session_timeout', $1, true)`, fmt.Sprint(hooks.CommitWithin.Milliseconds())); err != nil {
				return fmt.Errorf("bound the wait for the commit of publication %q's change: %w", name, err)
			}
		}
		if _, err := tx.Exec(ctx, sql); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.ReadOnlySQLTransaction {
				return fmt.Errorf("publish %s in publication %q: the source is read-only (a standby): run on its primary: %s; %w", list, name, sql, err)
			}
			if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.InsufficientPrivilege {
				return fmt.Errorf("publish %s in publication %q (the source role needs CREATE on the database and must own the tables): %w", list, name, err)
			}
			if errors.As(err, &pgErr) && pgErr.Detail != "" {
				return fmt.Errorf("publish %s in publication %q: %w: %s", list, name, err, pgErr.Detail)
			}
			return fmt.Errorf("publish %s in publication %q: %w", list, name, err)
		}
		if hooks.BeforeCommit != nil {
			return hooks.BeforeCommit()
		}
		return nil
	})
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.IdleInTransactionSessionTimeout {
		return nil, fmt.Errorf("commit the publishing of %s in publication %q: the commit came later than %s after the change (this process stalled in between), so the source ended the transaction and nothing changed: %w",
			list, name, hooks.CommitWithin, err)
	}
	if err != nil {
		return nil, err
	}
	return missing, nil
}

// checkPublication reports, all at once, the settings of an existing publication that would make
// pgconverge miss changes: an operation it does not publish, publish_via_partition_root with a
// partition among tables, or without it and with a partitioned table among tables (PostgreSQL docs
// §31.1, CREATE PUBLICATION), or, on PostgreSQL 18 and later, publish_generated_columns = stored.
// Row filters and column lists are followed (ReadPublicationShape).
func checkPublication(ctx context.Context, conn *pgx.Conn, name string, tables []changebatch.TableName) error {
	var ins, upd, del, trunc, viaRoot bool
	err := conn.QueryRow(ctx, `select pubinsert, pubupdate, pubdelete, pubtruncate, pubviaroot from pg_publication where pubname = $1`, name).
		Scan(&ins, &upd, &del, &trunc, &viaRoot)
	if err != nil {
		return fmt.Errorf("read publication %q: %w", name, err)
	}
	var errs []error
	if !ins || !upd || !del || !trunc {
		errs = append(errs, fmt.Errorf("publication %q does not publish every operation (insert %v, update %v, delete %v, truncate %v): a target that follows only some of them keeps rows the source changed or removed, with nothing to tell them apart, so pgconverge does not follow it; run ALTER PUBLICATION %s SET (publish = 'insert, update, delete, truncate'), or name another --publication (pgconverge creates its own, publishing every operation)",
			name, ins, upd, del, trunc, pgx.Identifier{name}.Sanitize()))
	}
	if pgsession.MajorVersion(conn.PgConn()) >= 18 {
		var gen string
		if err := conn.QueryRow(ctx, `select pubgencols::text from pg_publication where pubname = $1`, name).Scan(&gen); err != nil {
			return fmt.Errorf("read publication %q: %w", name, err)
		}
		if gen != "n" {
			errs = append(errs, fmt.Errorf("publication %q publishes generated columns (publish_generated_columns = stored, PostgreSQL 18): pgconverge recomputes them on the target and does not take their values from the stream; run ALTER PUBLICATION %s SET (publish_generated_columns = none)",
				name, pgx.Identifier{name}.Sanitize()))
		}
	}
	partErrs, err := checkPartitions(ctx, conn, name, viaRoot, tables)
	if err != nil {
		return err
	}
	errs = append(errs, partErrs...)
	return errors.Join(errs...)
}

// publishedPlace is SQL for what decides, given its pg_class row as c, whether a table of a schema
// or FOR ALL TABLES publication is published (PostgreSQL 15 pgoutput publishes a permanent table of
// a published schema): its schema, persistence and whether it is a partition, plus the row version
// of its row type (pg_type), which ALTER TABLE … SET SCHEMA rewrites, so a move out of the schema
// and back within one membership check still changes it. SET UNLOGGED and back rewrites the table
// (a new relfilenode, which ChangedColumns sees). Privileges, comments, statistics and storage
// options are left out: they change neither rows nor publication. Not seen: an ATTACH PARTITION
// of the table into a partitioned table published via its root and a DETACH again within one
// membership check (5 s), which leaves no trace in the catalog rows read here.
const publishedPlace = `(c.relnamespace::text || '.' || c.relpersistence::text || '.' || c.relispartition::text || '.' ||
    coalesce((select ty.xmin::text from pg_type ty where ty.oid = c.reltype), ''))`

// Memberships returns, per table, a token that identifies how the table belongs to publication:
// the oid of its pg_publication_rel row, of the pg_publication_namespace row of its schema, or of
// the publication when it is FOR ALL TABLES, plus the table's own oid and the publication's oid and
// row version (xmin, new after any ALTER PUBLICATION … SET); "" when it is not published. A table
// removed from the publication and added again, dropped and created again, or published for a
// while without some operation gets a new token, so a gap in the stream of its changes is
// detected after the fact. A table published through its schema or FOR ALL TABLES can leave the
// publication and come back without any publication row changing (ALTER TABLE … SET SCHEMA and
// back, SET UNLOGGED and back): its token also holds publishedPlace, which such a round trip
// changes and a GRANT, COMMENT, ANALYZE or ALTER TABLE … SET (storage options) does not. A table
// published both by
// its own row (maybe with a row filter) and through its schema has both in its token, so either
// one leaving or coming changes it (the rows published change). A partition published
// through an ancestor (publish_via_partition_root = false) is found through that ancestor's row.
// A partitioned table's token also holds its set of leaf partitions and their storage
// (partitionSet): rows that appear with an ATTACH PARTITION or vanish with a DETACH, a DROP or a
// TRUNCATE of a partition alone have no change in the stream, so such a change reloads the table.
func Memberships(ctx context.Context, conn *pgx.Conn, publication string, tables []changebatch.TableName) (map[changebatch.TableName]string, error) {
	schemas, names := make([]string, len(tables)), make([]string, len(tables))
	for i, t := range tables {
		schemas[i], names[i] = t.Schema, t.Name
	}
	rows, err := conn.Query(ctx, `select n.nspname::text, c.relname::text, coalesce(coalesce(
    (select 'all:' || p.oid || ':' || `+publishedPlace+` from pg_publication p where p.pubname = $1 and p.puballtables),
    (select 'rel:' || string_agg(r.oid::text, ',' order by r.oid) from pg_publication_rel r join pg_publication p on p.oid = r.prpubid
      where p.pubname = $1 and (r.prrelid = c.oid or r.prrelid in (select relid from pg_partition_ancestors(c.oid))))
      || coalesce(':schema:' || sch.oids, ''),
    'schema:' || sch.oids || ':' || `+publishedPlace+`)
  || '/' || c.oid || '/' || (select p.oid || ':' || p.xmin from pg_publication p where p.pubname = $1)
  || case when c.relkind = 'p' then '/partitions:' || `+partitionSet+` else '' end, '')
from pg_class c join pg_namespace n on n.oid = c.relnamespace
left join lateral (`+schemaMemberships(conn)+`) sch on true
where (n.nspname, c.relname) in (select * from unnest($2::text[], $3::text[]))`, publication, schemas, names)
	if err != nil {
		return nil, fmt.Errorf("read publication %q membership: %w", publication, err)
	}
	defer rows.Close()
	out := map[changebatch.TableName]string{}
	for rows.Next() {
		var n changebatch.TableName
		var token string
		if err := rows.Scan(&n.Schema, &n.Name, &token); err != nil {
			return nil, fmt.Errorf("read publication %q membership: %w", publication, err)
		}
		out[n] = token
	}
	return out, rows.Err()
}

// schemaMemberships is Memberships' subquery of the pg_publication_namespace rows (FOR TABLES IN
// SCHEMA, PostgreSQL 15 and later) that publish table c through its schema or an ancestor's, as
// one column oids; null on older servers, which publish no schemas.
func schemaMemberships(conn *pgx.Conn) string {
	if pgsession.MajorVersion(conn.PgConn()) < 15 {
		return `select null::text as oids`
	}
	return `select string_agg(pn.oid::text, ',' order by pn.oid) as oids from pg_publication_namespace pn
    join pg_publication p on p.oid = pn.pnpubid
    where p.pubname = $1 and pn.pnnspid in (select a.relnamespace from pg_class a
      where a.oid = c.oid or a.oid in (select relid from pg_partition_ancestors(c.oid)))`
}

// ReadPublicationShape fits t, as DescribeTable described it, to what publication publishes of
// it (pg_publication_tables; a partition published through an ancestor gets the ancestor's):
// RowFilter is its row filter (PostgreSQL docs §31.3 "Row Filters"), "" for none; with a column
// list (§31.4 "Column Lists"), Columns keep only the listed ones, Generated is emptied and
// ColumnList is set. A table not in the publication (yet) is left whole. It returns an error
// naming the fix when the column list leaves out a key column. A filter or list changed later is
// a membership change (Memberships), after which the table is described and loaded again.
func ReadPublicationShape(ctx context.Context, conn *pgx.Conn, publication string, t *changebatch.Table) error {
	var filter *string
	var attnames []string
	// Row filters and column lists came with PostgreSQL 15; before, every row and column is
	// published.
	shape := `rowfilter, attnames::text[]`
	if pgsession.MajorVersion(conn.PgConn()) < 15 {
		shape = `null::text, (select array_agg(attname::text) from pg_attribute
  where attrelid = (quote_ident($2) || '.' || quote_ident($3))::regclass and attnum > 0 and not attisdropped)`
	}
	err := conn.QueryRow(ctx, `select `+shape+` from pg_publication_tables where pubname = $1 and schemaname = $2 and tablename = $3`,
		publication, t.Schema, t.Name).Scan(&filter, &attnames)
	if errors.Is(err, pgx.ErrNoRows) {
		t.RowFilter = ""
		return nil
	}
	if err != nil {
		return fmt.Errorf("read what publication %q publishes of %s: %w", publication, t, err)
	}
	t.RowFilter = ""
	if filter != nil {
		t.RowFilter = *filter
	}
	for _, g := range t.Generated {
		if pgsession.MajorVersion(conn.PgConn()) >= 18 && slices.Contains(attnames, g.Name) {
			return fmt.Errorf("publication %q publishes generated column %q of %s (PostgreSQL 18: publish_generated_columns = stored, or a column list that names it): pgconverge computes generated columns on the target and does not take their values from the stream; run ALTER PUBLICATION %s SET (publish_generated_columns = none), and leave the column out of the table's column list if it has one",
				publication, g.Name, t, pgx.Identifier{publication}.Sanitize())
		}
	}
	var kept []changebatch.Column
	for _, c := range t.Columns {
		if slices.Contains(attnames, c.Name) {
			kept = append(kept, c)
		} else if c.Key {
			return fmt.Errorf("publication %q publishes %s with a column list that leaves out key column %q, so its changes cannot be matched to rows: run ALTER PUBLICATION %s SET TABLE %s (…, %s, …)",
				publication, t, c.Name, pgx.Identifier{publication}.Sanitize(), t.Quoted(), pgx.Identifier{c.Name}.Sanitize())
		}
	}
	if len(kept) < len(t.Columns) {
		t.Columns, t.Generated, t.ColumnList = kept, nil, true
	}
	return nil
}

// quotedList returns tables as a comma-separated list of quoted names, as SQL takes them.
func quotedList(tables []changebatch.TableName) string {
	list := ""
	for i, t := range tables {
		if i > 0 {
			list += ", "
		}
		list += t.Quoted()
	}
	return list
}
