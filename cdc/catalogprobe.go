package cdc

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/internal/pgsession"
)

// CatalogProbe is one cheap look at the source, in one statement and so one snapshot: what the
// catalog rows a stream's tables depend on look like, which transactions were running, and which
// commits were waiting for a synchronous standby.
//
// A catalog change (a table leaving the publication, a column added) is only seen by catalog
// reads whose snapshot was taken after its transaction became visible, and PostgreSQL writes a
// commit record, flushes it, marks the commit log and only then makes the transaction visible
// (PostgreSQL docs §74.1 "Transactions and Identifiers"). Without synchronous replication the
// last two steps follow the flush at once; with it (§27.2.8 "Synchronous Replication") the
// transaction waits between them until the standby confirms, as long as that takes, shown as
// wait event SyncRep. So a check may vouch for a flushed position P read before an earlier
// probe, once no transaction that was running at that probe may have committed unseen by this
// probe's snapshot (Unseen; see the engine's catalog watcher).
type CatalogProbe struct {
	// Fingerprint identifies the versions of the catalog rows that describe the probed tables
	// and their publication: the publication's row and its table and schema rows, the pg_class
	// rows of the probed tables, their partitions and ancestors, every schema, every inheritance
	// link, the probed tables' attributes, indexes and row types, and every enum type and label.
	// Any transactional change to those rows (ALTER PUBLICATION, ALTER TABLE, TRUNCATE, a
	// rename, ATTACH PARTITION, ALTER TYPE … ADD VALUE) gives another fingerprint; in-place
	// statistics updates (ANALYZE, VACUUM) do not. Equal fingerprints mean the catalog reads of
	// a check would find what they found before about the probed tables. New tables that a
	// selection would take in are not fingerprinted: the full check every few seconds finds
	// them. A probe reads rows in proportion to the probed tables, not to the database.
	Fingerprint string
	// Running are the top-level transaction ids (xid8) in progress at the probe's snapshot, or
	// running in a backend or prepared when the probe read them, in ascending order.
	Running []uint64
	// Unseen are the transactions that may have committed before the probe's snapshot without
	// being visible to it, in ascending order: those of Running that the commit log shows
	// committed when the probe read it (they left the process array after the snapshot: a commit
	// that waited for a standby and was released meanwhile, or one that committed while the
	// probe ran), and the backends that wait for a synchronous standby to confirm their commit
	// (wait event SyncRep; 0 for one without a transaction id of its own, a COMMIT PREPARED),
	// of which only those the role may see (WaitsVisible).
	Unseen []uint64
	// SyncStandbys is set when synchronous_standby_names is set, so that commits may wait for a
	// standby; WaitsVisible when the role sees every backend's wait event (pg_read_all_stats,
	// PostgreSQL docs §28.2.3).
	SyncStandbys, WaitsVisible bool
}

// catalogProbeSQL is ProbeCatalog's statement: $1 the publication, $2 the probed tables' oids;
// /*schemas*/ stands for probeSchemasSQL or, before PostgreSQL 15 (no schema publications), ”.
// Backends and prepared transactions show 32-bit xids; each is widened once (backends) to the
// xid8 nearest the snapshot's xmax (a running transaction is within 2^31 of it); a SyncRep waiter
// without an xid of its own (a COMMIT PREPARED) stays null, printed 0.
const catalogProbeSQL = `with snap as (select pg_current_snapshot() as s),
xm as (select pg_snapshot_xmax(s)::text::bigint as m from snap),
raw as (
  select backend_xid::text::bigint as b, wait_event = 'SyncRep' as waits from pg_stat_activity
    where backend_xid is not null or wait_event = 'SyncRep'
  union all select transaction::text::bigint, false from pg_prepared_xacts
),
backends as (
  select (m + ((b - m % 4294967296 + 6442450944) % 4294967296 - 2147483648))::text::xid8 as x, waits from xm, raw
),
running as (
  select x from snap, pg_snapshot_xip(snap.s) as x
  union select x from backends where x is not null
)
select array(select x::text from running),
  array(select coalesce(x::text, '0') from backends where waits
    union select x::text from running where pg_xact_status(x) = 'committed'),
  current_setting('synchronous_standby_names') <> '', pg_has_role('pg_read_all_stats', 'USAGE'),
  md5(concat_ws('/',
    (select string_agg(p.oid || ':' || p.xmin, ',') from pg_publication p where p.pubname = $1),
    (select string_agg(r.oid || ':' || r.xmin, ',' order by r.oid) from pg_publication_rel r
      join pg_publication p on p.oid = r.prpubid where p.pubname = $1),
    /*schemas*/,
    (select string_agg(c.oid || ':' || c.xmin, ',' order by c.oid) from pg_class c
      where c.oid in (select unnest($2::oid[]) union select t.relid from unnest($2::oid[]) as r(oid), pg_partition_tree(r.oid) as t
        union select a.relid from unnest($2::oid[]) as r(oid), pg_partition_ancestors(r.oid) as a)),
    (select count(*) || ':' || coalesce(sum(hashtextextended(n.oid || ':' || n.xmin, 0)::numeric), 0) from pg_namespace n),
    (select count(*) || ':' || coalesce(sum(hashtextextended(i.inhrelid || ':' || i.inhparent || ':' || i.xmin, 0)::numeric), 0)
      from pg_inherits i),
    (select string_agg(a.attrelid || '.' || a.attnum || ':' || a.xmin, ',' order by a.attrelid, a.attnum)
      from pg_attribute a where a.attrelid = any($2) and a.attnum > 0),
    (select string_agg(i.indexrelid || ':' || i.xmin, ',' order by i.indexrelid) from pg_index i where i.indrelid = any($2)),
    (select string_agg(t.oid || ':' || t.xmin, ',' order by t.oid) from pg_type t where t.typrelid = any($2) or t.typtype = 'e'),
    (select count(*) || ':' || coalesce(sum(hashtextextended(e.oid || ':' || e.xmin, 0)::numeric), 0) from pg_enum e)))`

// probeSchemasSQL fingerprints the publication's pg_publication_namespace rows (PostgreSQL 15
// and later).
const probeSchemasSQL = `(select string_agg(r.oid || ':' || r.xmin, ',' order by r.oid) from pg_publication_namespace r
      join pg_publication p on p.oid = r.pnpubid where p.pubname = $1)`

// ProbeCatalog returns a CatalogProbe of the tables oids (source pg_class oids: the streamed
// tables and those kept by snapshots) and publication, read on conn in one statement, so in one
// snapshot. Errors are the source's.
func ProbeCatalog(ctx context.Context, conn *pgx.Conn, publication string, oids []uint32) (CatalogProbe, error) {
	var p CatalogProbe
	var running, unseen []string
	schemas := probeSchemasSQL
	if pgsession.MajorVersion(conn.PgConn()) < 15 {
		schemas = `''`
	}
	err := conn.QueryRow(ctx, strings.Replace(catalogProbeSQL, "/*schemas*/", schemas, 1), publication, oids).Scan(&running, &unseen, &p.SyncStandbys, &p.WaitsVisible, &p.Fingerprint)
	if err != nil {
		return p, fmt.Errorf("probe the source's catalogs: %w", err)
	}
	if p.Running, err = parseXids(running); err != nil {
		return p, err
	}
	if p.Unseen, err = parseXids(unseen); err != nil {
		return p, err
	}
	return p, nil
}

// parseXids parses xid8 values printed as text, in ascending order.
func parseXids(texts []string) ([]uint64, error) {
	out := make([]uint64, len(texts))
	for i, t := range texts {
		x, err := strconv.ParseUint(t, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("probe the source's catalogs: transaction id %q: %w", t, err)
		}
		out[i] = x
	}
	slices.Sort(out)
	return out, nil
}
