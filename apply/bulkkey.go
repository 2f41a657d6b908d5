package apply

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// Bulk loads build the primary key at the end. Storing rows into a table without an index and
// building the index once, from sorted rows, costs the target about half of what maintaining it
// row by row does (a 2,000,000-row pgbench_accounts here: 2.7 s of COPY and 0.7 s of index build
// against 4.5 s of COPY with the key). A backfill of a target table that holds no row and that no
// stream follows (coverage.Unwritten) drops the key first (DeferKey) and builds it when it
// completes (RestoreKey), in the transaction that records it complete. Meanwhile only that
// backfill writes the table: its chunks cover disjoint key ranges, each copied in one
// transaction, so no key can be stored twice; a merge (a repair, another slot's stream) fails,
// since ON CONFLICT needs the key, and is retried. A backfill or a daemon start that finds the
// key missing (the backfill was interrupted) restores it before anything else, so no other run
// ever copies into the table without its key.
//
// A bulk load also stores its version in the table: DeferKey makes the snapshot version (S, 0)
// the defaults of _cdc_lsn and _cdc_seq, so the load's COPY names only the source's columns and
// the target fills the version itself (Tx.CopySnapshotRows), which spares it parsing three
// columns per row (about a sixth of a COPY's cost for pgbench_accounts) and lets the source's
// COPY output, text or binary, pass through unchanged. RestoreKey drops those defaults in the
// statement that builds the key, so they exist exactly while the key is missing.

// bulkIndexMemory is the least maintenance_work_mem a key build gets (256 MiB): the sort of a
// large table's keys then runs mostly in memory, on the target's parallel maintenance workers.
const bulkIndexMemory = 256 << 20

// DeferKey drops the primary key of keyed target table t, over conn (not in a transaction), for a
// bulk load at snapshot version ver (S, 0) that restores it when it completes, and makes ver the
// defaults of the version columns (also when the key is missing already). It returns an error for a keyless table or a version
// that is not a snapshot's.
func DeferKey(ctx context.Context, conn *pgx.Conn, t changebatch.Table, ver changebatch.Version) error {
	if t.Keyless || ver.Seq != 0 {
		return fmt.Errorf("defer the key of %s for a bulk load at %s: only a keyed table loaded at a snapshot version (S, 0) can", t, ver)
	}
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		name, err := primaryKeyName(ctx, tx, t)
		if err != nil {
			return err
		}
		alter := "alter table " + t.Quoted() + " alter column " + qLSN + " set default " + bulkLSNDefault(ver) +
			", alter column " + qSeq + " set default 0"
		if name != "" {
			alter += ", drop constraint " + pgx.Identifier{name}.Sanitize()
		}
		if _, err := tx.Exec(ctx, alter); err != nil {
			return fmt.Errorf("drop the primary key of target table %s for its bulk load: %w", t, err)
		}
		return nil
	})
}

// EmptyInterruptedBulkLoad empties target table t, over conn (not in a transaction), when every
// row it holds is a live row an interrupted bulk load wrote, at one of its chunks' snapshot
// versions (S, 0) for S in loadedAt, so that a new bulk load starts it over. A row any other
// writer left (a streamed change, a tombstone, a repair at a snapshot of its own) keeps the table
// as it is. It reports whether it emptied the table; the check reads the whole table.
func EmptyInterruptedBulkLoad(ctx context.Context, conn *pgx.Conn, t changebatch.Table, loadedAt []pglogrepl.LSN) (bool, error) {
	if t.Keyless {
		return false, nil
	}
	lsns := make([]string, len(loadedAt))
	for i, l := range loadedAt {
		lsns[i] = l.String()
	}
	emptied := false
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "lock table only "+t.Quoted()+" in access exclusive mode"); err != nil {
			return fmt.Errorf("lock target table %s to empty it: %w", t, err)
		}
		err := tx.QueryRow(ctx, "select not exists (select from only "+t.Quoted()+" where "+qDeleted+" or "+qSeq+" <> 0 or not "+
			qLSN+" = any($1::pg_lsn[]))", lsns).Scan(&emptied)
		if err != nil {
			return fmt.Errorf("read the versions of target table %s: %w", t, err)
		}
		if !emptied {
			return nil
		}
		if _, err := tx.Exec(ctx, "truncate only "+t.Quoted()); err != nil {
			return fmt.Errorf("empty target table %s of its interrupted bulk load: %w", t, err)
		}
		return nil
	})
	return emptied, err
}

// bulkLSNDefault is the default of _cdc_lsn during a bulk load at ver, as DeferKey sets it and as
// pg_get_expr prints it back.
func bulkLSNDefault(ver changebatch.Version) string {
	return "'" + ver.LSN.String() + "'::pg_lsn"
}

// bulkDefaults reports whether target table t's version columns default to ver, as during its
// bulk load at ver (DeferKey), and its _cdc_deleted to false: a COPY of t's data columns alone then
// stores every row at ver, live.
func bulkDefaults(ctx context.Context, tx pgx.Tx, t changebatch.Table, ver changebatch.Version) (bool, error) {
	var lsn, seq, deleted string
	err := tx.QueryRow(ctx, `select
  coalesce(max(pg_get_expr(d.adbin, d.adrelid)) filter (where a.attname = $2), ''),
  coalesce(max(pg_get_expr(d.adbin, d.adrelid)) filter (where a.attname = $3), ''),
  coalesce(max(pg_get_expr(d.adbin, d.adrelid)) filter (where a.attname = $4), '')
from pg_attrdef d join pg_attribute a on a.attrelid = d.adrelid and a.attnum = d.adnum
where d.adrelid = $1::regclass`, t.Quoted(), changebatch.ColLSN, changebatch.ColSeq, changebatch.ColDeleted).Scan(&lsn, &seq, &deleted)
	if err != nil {
		return false, fmt.Errorf("read the defaults of target table %s: %w", t, err)
	}
	return ver.Seq == 0 && lsn == bulkLSNDefault(ver) && seq == "0" && deleted == "false", nil
}

// RestoreKey builds the primary key of keyed target table t on the source's key columns, inside
// tx, when the table has none (DeferKey), with at least bulkIndexMemory of maintenance_work_mem
// for the rest of tx, and drops the bulk load's version defaults. It reports whether it built
// one. Rows that share a key fail the build: that is an error and nothing is removed.
func RestoreKey(ctx context.Context, tx pgx.Tx, t changebatch.Table) (bool, error) {
	if t.Keyless {
		return false, nil
	}
	name, err := primaryKeyName(ctx, tx, t)
	if err != nil || name != "" {
		return false, err
	}
	// Missing: take the lock the build takes anyway, then look again. Another process (a daemon
	// or a backfill starting while a bulk load ends) may have built it meanwhile; a second build
	// would fail ("multiple primary keys") and end that process's run.
	if _, err := tx.Exec(ctx, "lock table only "+t.Quoted()+" in access exclusive mode"); err != nil {
		return false, fmt.Errorf("lock target table %s to build its primary key: %w", t, err)
	}
	if name, err = primaryKeyName(ctx, tx, t); err != nil || name != "" {
		return false, err
	}
	if _, err := tx.Exec(ctx, `select set_config('maintenance_work_mem',
  greatest(pg_size_bytes(current_setting('maintenance_work_mem')), $1) / 1024 || 'kB', true)`, int64(bulkIndexMemory)); err != nil {
		return false, fmt.Errorf("raise maintenance_work_mem to build the primary key of %s: %w", t, err)
	}
	var keys []string
	for _, i := range t.KeyOrder() {
		keys = append(keys, pgx.Identifier{t.Columns[i].Name}.Sanitize())
	}
	if _, err := tx.Exec(ctx, "alter table "+t.Quoted()+" alter column "+qLSN+" drop default, alter column "+qSeq+
		" drop default, add primary key ("+strings.Join(keys, ", ")+")"); err != nil {
		return false, fmt.Errorf("build the primary key (%s) of target table %s after its bulk load: %w", strings.Join(keys, ", "), t, err)
	}
	return true, nil
}

// primaryKeyName returns the name of target table t's primary key constraint, "" when it has none.
func primaryKeyName(ctx context.Context, tx pgx.Tx, t changebatch.Table) (string, error) {
	var name string
	err := tx.QueryRow(ctx, `select coalesce((select conname::text from pg_constraint where conrelid = $1::regclass and contype = 'p'), '')`,
		t.Quoted()).Scan(&name)
	if err != nil {
		return "", fmt.Errorf("look up the primary key of target table %s: %w", t, err)
	}
	return name, nil
}
