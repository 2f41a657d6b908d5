package apply

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// A keyless table (changebatch.Table.Keyless) holds, on the target, one entry per occurrence of a
// row value that some change or snapshot brought: docs/design.md, "Tables without a key", gives
// the rule and why it converges. In short, an entry is identified by (row hash, version that
// brought it, occurrence) and never changes identity; the live entries of a value are the
// source's copies of it:
//   - a streamed INSERT at V adds entry (h, V, 1);
//   - a streamed DELETE at V (an UPDATE is a DELETE of the old value and an INSERT of the new one)
//     marks one live entry of h older than V deleted at V, the newest one; when h has none, a
//     "phantom" entry (h, V, 0) records the delete, born deleted;
//   - a snapshot at S brings entries (h, (S, 0), ctid): it first marks every live entry of h
//     older than S deleted at (S, 0), then hands each delete newer than S that took an entry
//     older than S (or none) one of the new entries instead: those deletes come after S, so
//     they remove copies the snapshot shows;
//   - a change at or below a snapshot of its value ((S, 0) > V), or at or below the fence, is
//     a replay and suppressed, and so is a second delivery of a change (an entry of the same
//     version exists).
//
// Every writer of a keyless table locks its fence row FOR UPDATE (lockFence), so they take turns.

// Quoted names of the keyless columns.
var (
	qRowHash    = pgx.Identifier{changebatch.ColRowHash}.Sanitize()
	qOccurrence = pgx.Identifier{changebatch.ColOccurrence}.Sanitize()
	qDeletedLSN = pgx.Identifier{changebatch.ColDeletedLSN}.Sanitize()
	qDeletedSeq = pgx.Identifier{changebatch.ColDeletedSeq}.Sanitize()
	qOrd        = pgx.Identifier{"_cdc_ord"}.Sanitize()
)

// RowHashSQL returns the SQL expression of a keyless table's row hash (bytea, SHA-256) over the
// data columns of t as relation alias rel holds them: the hash of the row's text form as the
// target's types print it (the session settings of pgsession fix how), so two values hash alike
// exactly when every column prints alike; NULL and the empty string differ.
func RowHashSQL(t changebatch.Table, rel string) string {
	cols := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		cols[i] = rel + "." + pgx.Identifier{c.Name}.Sanitize()
	}
	return "sha256(convert_to(row(" + strings.Join(cols, ", ") + ")::text, 'UTF8'))"
}

// keylessTableSQL returns the DDL of a keyless table's target table and its two partial indexes:
// the live entries of a value by version, the deleted ones by the version that deleted them.
func keylessTableSQL(t changebatch.Table) []string {
	var b strings.Builder
	b.WriteString("create table " + t.Quoted() + " (")
	writeColumnsDDL(&b, t)
	b.WriteString(qRowHash + " bytea not null, " + qOccurrence + " bigint not null, ")
	b.WriteString(qLSN + " pg_lsn not null, " + qSeq + " bigint not null, ")
	b.WriteString(qDeleted + " boolean not null default false, " + qUnknown + " text[], ")
	b.WriteString(qDeletedLSN + " pg_lsn, " + qDeletedSeq + " bigint, ")
	b.WriteString("primary key (" + qRowHash + ", " + qLSN + ", " + qSeq + ", " + qOccurrence + "))")
	return []string{b.String(),
		"create index on " + t.Quoted() + " (" + qRowHash + ", " + qLSN + ", " + qSeq + ", " + qOccurrence + ") where not " + qDeleted,
		"create index on " + t.Quoted() + " (" + qRowHash + ", " + qDeletedLSN + ", " + qDeletedSeq + ") where " + qDeleted,
	}
}

// keylessStageSQL returns the DDL of a session's staging table for keyless table t.
func keylessStageSQL(t changebatch.Table, stage string) string {
	cols := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		cols[i] = pgx.Identifier{c.Name}.Sanitize()
	}
	return "create temporary table " + pgx.Identifier{stage}.Sanitize() + " as select " +
		strings.Join(cols, ", ") + ", " + qLSN + ", " + qSeq + ", " + qDeleted + ", " + qOccurrence + ", " +
		qRowHash + ", 0::int as " + qOrd + " from " + t.Quoted() + " with no data"
}

// dataColumns returns t's data columns, quoted, joined, each prefixed with rel and a dot when rel is set.
func dataColumns(t changebatch.Table, rel string) string {
	cols := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		cols[i] = pgx.Identifier{c.Name}.Sanitize()
		if rel != "" {
			cols[i] = rel + "." + cols[i]
		}
	}
	return strings.Join(cols, ", ")
}

// stageKeyless copies rows [from, to) of v into the table's staging table with their order
// (_cdc_ord); deletes are staged with _cdc_deleted true. With hash set it also computes their row
// hashes into _cdc_row_hash (the snapshot merge reads them in several statements); the streamed
// merge computes each row's hash in the one statement that reads the row (keylessInsertSQL,
// keylessDeleteSQL), so it leaves _cdc_row_hash null and spares a pass that writes every staged
// row again.
func (t *Tx) stageKeyless(ctx context.Context, v *changebatch.View, from, to int, hash bool) (string, error) {
	stage, err := t.stage(ctx, v.Table, to-from)
	if err != nil {
		return "", err
	}
	t.buf.Reset()
	for i := from; i < to; i++ {
		writeCopyValues(&t.buf, v, i)
		ver := v.Version(i)
		deleted := "f"
		if v.Op(i) == changebatch.OpDelete {
			deleted = "t"
		}
		fmt.Fprintf(&t.buf, "%s\t%d\t%s\t%d\t%d\n", ver.LSN, ver.Seq, deleted, v.Occurrence(i), i-from)
	}
	q := pgx.Identifier{"pg_temp", stage}.Sanitize()
	pc, err := t.pgConn(ctx)
	if err != nil {
		return "", err
	}
	if _, err := pc.CopyFrom(ctx, bytes.NewReader(t.buf.Bytes()), keylessCopySQL(v.Table, q)); err != nil {
		return "", fmt.Errorf("stage %d rows of %s: %w", to-from, v.Table, withCopyContext(err))
	}
	if !hash {
		return q, nil
	}
	if _, err := t.tx.Exec(ctx, keylessHashSQL(v.Table, q)); err != nil {
		return "", fmt.Errorf("hash the staged rows of %s: %w", v.Table, err)
	}
	return q, nil
}

// keylessCopySQL returns the COPY statement that fills stage (quoted, in pg_temp), the staging
// table of keyless table t, with the rows stageKeyless writes: the data columns, the version,
// whether the change is a delete, its occurrence and its order in the batch (_cdc_ord).
func keylessCopySQL(t changebatch.Table, stage string) string {
	return "copy " + stage + " (" + dataColumns(t, "") + ", " + qLSN + ", " + qSeq + ", " + qDeleted + ", " + qOccurrence + ", " + qOrd + ") from stdin"
}

// keylessHashSQL returns the statement that computes the row hash (RowHashSQL) of every row
// staged in stage (quoted), the staging table of keyless table t.
func keylessHashSQL(t changebatch.Table, stage string) string {
	return "update " + stage + " as s set " + qRowHash + " = " + RowHashSQL(t, "s")
}

// keylessHashedSQL returns a query over the staged changes of keyless table t in stage (quoted)
// that are deletes (deleted set) or inserts: their data columns, version, order (_cdc_ord) and
// row hash (RowHashSQL), computed once per row (OFFSET 0 keeps the query from being merged into
// the one reading it, which would compute the hash again wherever it is used). Inserts come in
// row hash order, so that the probes and insertions into the target's indexes, which lead with
// the row hash, go through each index page once rather than at random (the deletes are sorted
// by their row hash for their rounds already).
func keylessHashedSQL(t changebatch.Table, stage string, deleted bool) string {
	not, order := "not ", " order by "+qRowHash
	if deleted {
		not, order = "", ""
	}
	return "select " + dataColumns(t, "s") + ", s." + qLSN + ", s." + qSeq + ", s." + qOrd + ", " + RowHashSQL(t, "s") + " as " + qRowHash +
		" from " + stage + " as s where " + not + "s." + qDeleted + order + " offset 0"
}

// keylessFenced is the condition under which staged change s of a keyless table is at or below
// the table's fence. The fence is read once per statement (an uncorrelated subquery: PostgreSQL
// runs it once, as an InitPlan). $1 and $2 are the table's schema and name.
var keylessFenced = "(s." + qLSN + ", s." + qSeq + ") <= (select f.fence_lsn, f.fence_seq from pgconverge.tables as f where f.schema_name = $1 and f.table_name = $2)"

// keylessReplay returns the condition under which staged change s of keyless table t is a
// replay: at or below the table's fence (keylessFenced), or below a snapshot of its value (an
// entry at (S, 0)), or meets one of the conditions more. $1 and $2 are the table's schema and
// name.
func keylessReplay(t changebatch.Table, more ...string) string {
	conds := append([]string{keylessFenced,
		"exists (select 1 from " + t.Quoted() + " as e where e." + qRowHash + " = s." + qRowHash +
			" and e." + qSeq + " = 0 and (e." + qLSN + ", e." + qSeq + ") > (s." + qLSN + ", s." + qSeq + "))"}, more...)
	return "(" + strings.Join(conds, " or ") + ")"
}

// mergeKeyless applies the streamed changes [from, to) of v (no truncate among them) to keyless
// table v.Table: the inserts in one statement, then the deletes in rounds (keylessDeleteSQL), the
// first round sent with the inserts, in one round trip. JIT compilation is off for these
// statements (keylessNoJIT).
func (t *Tx) mergeKeyless(ctx context.Context, v *changebatch.View, from, to int) (Result, error) {
	tab := v.Table
	if _, err := t.lockFence(ctx, tab); err != nil {
		return Result{}, err
	}
	inserts, deletes, dups := 0, 0, false
	seen := make(map[changebatch.Version]struct{}, to-from)
	for i := from; i < to; i++ {
		if v.Op(i) == changebatch.OpDelete {
			deletes++
			continue
		}
		inserts++
		if _, ok := seen[v.Version(i)]; ok {
			dups = true
		}
		seen[v.Version(i)] = struct{}{}
	}
	stage, err := t.stageKeyless(ctx, v, from, to, false)
	if err != nil {
		return Result{}, err
	}
	var applied int64
	del := keylessDeleteSQL(tab, stage)
	batch := &pgx.Batch{}
	batch.Queue(keylessNoJIT)
	if inserts > 0 {
		batch.Queue(keylessInsertSQL(tab, stage, dups), tab.Schema, tab.Name)
	}
	if deletes > 0 {
		batch.Queue(del, tab.Schema, tab.Name, 1)
	}
	batch.Queue(keylessRestoreJIT)
	br := t.tx.SendBatch(ctx, batch)
	rounds, n, err := readKeylessBatch(br, tab, to-from, inserts > 0, deletes > 0)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("merge rows into keyless table %s: %w", tab, describeConstraint(cerr))
	}
	if err != nil {
		return Result{}, err
	}
	applied += n
	// Deletes of different values are independent; those of one value go in their order. Round
	// k holds the k-th delete of each value, so most batches need one statement.
	if rounds > 1 {
		batch := &pgx.Batch{}
		batch.Queue(keylessNoJIT)
		for r := int64(2); r <= rounds; r++ {
			batch.Queue(del, tab.Schema, tab.Name, r)
		}
		batch.Queue(keylessRestoreJIT)
		br := t.tx.SendBatch(ctx, batch)
		_, err := br.Exec()
		for r := int64(2); err == nil && r <= rounds; r++ {
			var n, more int64
			if err = br.QueryRow().Scan(&n, &more); err != nil {
				err = fmt.Errorf("delete rows from keyless table %s: %w", tab, describeConstraint(err))
			}
			applied += n
		}
		if cerr := br.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("delete rows from keyless table %s: %w", tab, cerr)
		}
		if err != nil {
			return Result{}, err
		}
	}
	return Result{Applied: applied, Suppressed: int64(to-from) - applied}, nil
}

// readKeylessBatch reads the results of mergeKeyless's first batch (keylessNoJIT, the insert
// statement when inserted, the first round of deletes when deleted, keylessRestoreJIT) of rows
// staged changes of keyless table tab. It returns the number of delete rounds (0 without deletes)
// and how many changes the statements applied.
func readKeylessBatch(br pgx.BatchResults, tab changebatch.Table, rows int, inserted, deleted bool) (rounds, applied int64, err error) {
	if _, err := br.Exec(); err != nil {
		return 0, 0, fmt.Errorf("turn JIT off for keyless table %s: %w", tab, err)
	}
	if inserted {
		tag, err := br.Exec()
		if err != nil {
			return 0, 0, fmt.Errorf("insert %d rows into keyless table %s: %w", rows, tab, describeConstraint(err))
		}
		applied = tag.RowsAffected()
	}
	if deleted {
		var n int64
		if err := br.QueryRow().Scan(&n, &rounds); err != nil {
			return 0, 0, fmt.Errorf("delete rows from keyless table %s: %w", tab, describeConstraint(err))
		}
		applied += n
	}
	if _, err := br.Exec(); err != nil {
		return 0, 0, fmt.Errorf("turn JIT back on for keyless table %s: %w", tab, err)
	}
	return rounds, applied, nil
}

// keylessNoJIT and keylessRestoreJIT bracket the keyless merge statements: JIT compilation off
// for them, then jit as the session had it (its reset value: server, role, database or
// connection setting). The staging table has no statistics, so the planner prices these
// statements, whose every row runs index probes, far above jit_above_cost, and compiling them
// took about 0.3 s a statement, more than the statements themselves on 20,000 rows.
const (
	keylessNoJIT      = "set local jit = off"
	keylessRestoreJIT = "set local jit to default"
)

// keylessInsertSQL returns the statement that adds the staged inserts of keyless table t from
// stage (quoted) as entries (h, V, 1), but not replays (keylessReplay) nor a second delivery (the
// entry exists). One probe of the primary key answers both, as both look at the value's entries
// at or above V: an entry from a snapshot newer than V, or the entry (h, V, 1) itself (a CASE,
// not an OR, which PostgreSQL would split into two probes of a bitmap scan). Writers of
// a keyless table take turns (the fence row's lock), so nothing else adds an entry meanwhile,
// and the primary key refuses a second (h, V, 1) anyway; the statement has no ON CONFLICT clause,
// whose check would probe the primary key once more per row, unless dups is set: some version is
// staged twice among the inserts, and the statement, which does not see the rows it adds itself,
// lets ON CONFLICT DO NOTHING skip the second copy. $1 and $2 are the table's schema and name.
func keylessInsertSQL(t changebatch.Table, stage string, dups bool) string {
	sql := "insert into " + t.Quoted() + " (" + dataColumns(t, "") + ", " + qRowHash + ", " + qOccurrence + ", " + qLSN + ", " + qSeq + ")\n" +
		"select " + dataColumns(t, "s") + ", s." + qRowHash + ", 1, s." + qLSN + ", s." + qSeq + " from (" + keylessHashedSQL(t, stage, false) + ") as s\n" +
		"where not (" + keylessFenced + " or exists (select 1 from " + t.Quoted() + " as e where e." + qRowHash + " = s." + qRowHash +
		" and (e." + qLSN + ", e." + qSeq + ") >= (s." + qLSN + ", s." + qSeq + ") and case when e." + qSeq + " = 0 then true else (e." + qLSN + ", e." + qSeq + ", e." + qOccurrence + ") = (s." + qLSN + ", s." + qSeq + ", 1) end))"
	if dups {
		sql += "\non conflict do nothing"
	}
	return sql
}

// keylessDeleteSQL returns the statement that applies round $3 of the staged deletes of keyless
// table t, at most one per value: the k-th delete of a value (in _cdc_ord order) is in round k.
// Each delete of the round that is not a replay and was not applied already marks the newest
// live entry of its value older than it deleted at its version, or records a phantom entry when
// there is none. It returns how many deletes it applied and the number of rounds.
func keylessDeleteSQL(t changebatch.Table, stage string) string {
	q := t.Quoted()
	// OFFSET 0 keeps the check of an earlier delivery a subplan run per row by its index: without
	// it PostgreSQL may turn it into an anti join, or a hashed subplan, that reads every deleted
	// entry of the table.
	replay := keylessReplay(t, "exists (select 1 from "+q+" as e where e."+qRowHash+" = s."+qRowHash+
		" and e."+qDeleted+" and e."+qDeletedLSN+" = s."+qLSN+" and e."+qDeletedSeq+" = s."+qSeq+" offset 0)")
	// The aliases begin with _cdc_, which no column of a keyless table does
	// (changebatch.Table.Validate).
	return "with n as materialized (select h.*, row_number() over (partition by h." + qRowHash + " order by h." + qOrd + ") as _cdc_round from (" +
		keylessHashedSQL(t, stage, true) + ") as h),\n" +
		"victim as materialized (select s.*, v.ctid as _cdc_victim from n as s left join lateral (select e.ctid from " + q + " as e where e." + qRowHash + " = s." + qRowHash +
		" and not e." + qDeleted + " and (e." + qLSN + ", e." + qSeq + ") < (s." + qLSN + ", s." + qSeq + ")" +
		" order by e." + qLSN + " desc, e." + qSeq + " desc, e." + qOccurrence + " desc limit 1) as v on true\n" +
		"  where s._cdc_round = $3 and not " + replay + "),\n" +
		"killed as (update " + q + " as e set " + qDeleted + " = true, " + qDeletedLSN + " = x." + qLSN + ", " + qDeletedSeq + " = x." + qSeq +
		" from victim as x where e.ctid = x._cdc_victim returning 1),\n" +
		"phantom as (insert into " + q + " (" + dataColumns(t, "") + ", " + qRowHash + ", " + qOccurrence + ", " + qLSN + ", " + qSeq + ", " +
		qDeleted + ", " + qDeletedLSN + ", " + qDeletedSeq + ") select " + dataColumns(t, "x") + ", x." + qRowHash + ", 0, x." + qLSN + ", x." + qSeq +
		", true, x." + qLSN + ", x." + qSeq + " from victim as x where x._cdc_victim is null returning 1)\n" +
		"select (select count(*) from killed) + (select count(*) from phantom), (select coalesce(max(_cdc_round), 0) from n)"
}

// mergeKeylessSnapshot applies snapshot rows [0, v.Len()) of keyless table v.Table, all at
// version ver = (S, 0) above the fence (ApplySnapshot checked it), in four statements: values
// with an entry from a newer snapshot are left alone; every other value's live entries older
// than S are marked deleted at (S, 0); the rows are added as entries (h, S, 0, ctid), those read
// before (a chunk read again) once; and each delete newer than S that took an entry older than S
// (or none) takes one of the new entries instead.
func (t *Tx) mergeKeylessSnapshot(ctx context.Context, v *changebatch.View, ver changebatch.Version) (Result, error) {
	tab := v.Table
	stage, err := t.stageKeyless(ctx, v, 0, v.Len(), true)
	if err != nil {
		return Result{}, err
	}
	s := ver.LSN.String()
	// Values a newer snapshot brought are no concern of this one.
	if _, err := t.tx.Exec(ctx, keylessSkipNewerSQL(tab, stage), s); err != nil {
		return Result{}, fmt.Errorf("merge snapshot rows of keyless table %s: %w", tab, err)
	}
	// Entries older than S of the snapshot's values: the snapshot holds their state.
	if _, err := t.tx.Exec(ctx, keylessSupersedeStagedSQL(tab, stage), s); err != nil {
		return Result{}, fmt.Errorf("merge snapshot rows of keyless table %s: %w", tab, err)
	}
	var inserted int64
	err = t.tx.QueryRow(ctx, keylessSnapshotSQL(tab, stage), s).Scan(&inserted)
	if err != nil {
		return Result{}, fmt.Errorf("merge snapshot rows of keyless table %s: %w", tab, describeConstraint(err))
	}
	return Result{Applied: inserted, Suppressed: int64(v.Len()) - inserted}, nil
}

// keylessSkipNewerSQL returns the statement that removes from stage (quoted) the staged snapshot
// rows, at ($1, 0), of keyless table t whose value has an entry from a newer snapshot: those
// values are no concern of this snapshot.
func keylessSkipNewerSQL(t changebatch.Table, stage string) string {
	return "delete from " + stage + " as s where exists (select 1 from " + t.Quoted() + " as e where e." + qRowHash + " = s." + qRowHash +
		" and e." + qSeq + " = 0 and (e." + qLSN + ", e." + qSeq + ") > ($1::pg_lsn, 0))"
}

// keylessSupersedeStagedSQL returns the statement that marks the live entries of keyless table t
// older than the snapshot ($1, 0) of a value staged in stage (quoted) deleted at ($1, 0)
// (supersedeSQL): the snapshot holds those values' state.
func keylessSupersedeStagedSQL(t changebatch.Table, stage string) string {
	return supersedeSQL(t, "e."+qRowHash+" in (select "+qRowHash+" from "+stage+")")
}

// keylessSnapshotSQL returns the statement that adds staged snapshot rows (at ($1, 0)) of keyless
// table t as entries, pairing the n-th new entry of a value with the n-th of its deletes that
// still lack one (newer than the snapshot, on an entry older than it or on a phantom): that entry
// is born deleted by it, the delete's old entry counts as replaced by the snapshot (its phantom
// goes). It returns how many entries it added.
func keylessSnapshotSQL(t changebatch.Table, stage string) string {
	q := t.Quoted()
	at := "($1::pg_lsn, 0::bigint)"
	born := "(e." + qLSN + ", e." + qSeq + ")"
	killedAt := "(e." + qDeletedLSN + ", e." + qDeletedSeq + ")"
	phantom := "(e." + qOccurrence + " = 0 and e." + qSeq + " > 0)"
	// The aliases begin with _cdc_, which no column of a keyless table does
	// (changebatch.Table.Validate).
	return "with debts as (select e.ctid as _cdc_debt_id, e." + qRowHash + " as _cdc_debt_hash, e." + qDeletedLSN + " as _cdc_debt_lsn, e." + qDeletedSeq +
		" as _cdc_debt_seq, " + phantom + " as _cdc_debt_phantom, row_number() over (partition by e." + qRowHash + " order by " + killedAt + ") as _cdc_debt_n" +
		" from " + q + " as e where e." + qDeleted + " and " + killedAt + " > " + at + " and (" + born + " < " + at + " or " + phantom + ")" +
		" and e." + qRowHash + " in (select " + qRowHash + " from " + stage + ")),\n" +
		"fresh as (select s.*, row_number() over (partition by s." + qRowHash + " order by s." + qOccurrence + ") as _cdc_debt_n from " + stage + " as s" +
		" where not exists (select 1 from " + q + " as e where e." + qRowHash + " = s." + qRowHash + " and " + born + " = " + at +
		" and e." + qOccurrence + " = s." + qOccurrence + ")),\n" +
		"paired as (select f.*, d._cdc_debt_id, d._cdc_debt_lsn, d._cdc_debt_seq, d._cdc_debt_phantom from fresh as f" +
		" left join debts as d on d._cdc_debt_hash = f." + qRowHash + " and d._cdc_debt_n = f._cdc_debt_n),\n" +
		"added as (insert into " + q + " (" + dataColumns(t, "") + ", " + qRowHash + ", " + qOccurrence + ", " + qLSN + ", " + qSeq + ", " +
		qDeleted + ", " + qDeletedLSN + ", " + qDeletedSeq + ") select " + dataColumns(t, "p") + ", p." + qRowHash + ", p." + qOccurrence +
		", $1::pg_lsn, 0, p._cdc_debt_id is not null, p._cdc_debt_lsn, p._cdc_debt_seq from paired as p returning 1),\n" +
		"gone as (delete from " + q + " as e using paired as p where p._cdc_debt_phantom and e.ctid = p._cdc_debt_id),\n" +
		"replaced as (update " + q + " as e set " + qDeletedLSN + " = $1::pg_lsn, " + qDeletedSeq + " = 0 from paired as p" +
		" where not p._cdc_debt_phantom and e.ctid = p._cdc_debt_id)\n" +
		"select count(*) from added"
}

// keylessFenceSQL returns the statement that marks every live entry of keyless table t older
// than ($1, $2) deleted at that version and removes the phantoms at or below it, which only a
// replay could still meet and the fence refuses.
func keylessFenceSQL(t changebatch.Table) []string {
	q := t.Quoted()
	return []string{
		"update " + q + " set " + qDeleted + " = true, " + qDeletedLSN + " = $1::pg_lsn, " + qDeletedSeq + " = $2" +
			" where not " + qDeleted + " and (" + qLSN + ", " + qSeq + ") < ($1::pg_lsn, $2)",
		"delete from " + q + " where " + qDeleted + " and " + qOccurrence + " = 0 and " + qSeq + " > 0 and (" + qDeletedLSN + ", " + qDeletedSeq + ") <= ($1::pg_lsn, $2)",
	}
}

// rehashSQL returns the statement that computes every entry's row hash of keyless table t again,
// after its columns changed.
func rehashSQL(t changebatch.Table) string {
	return "update " + t.Quoted() + " as r set " + qRowHash + " = " + RowHashSQL(t, "r") + " where " + qRowHash + " <> " + RowHashSQL(t, "r")
}

// supersedeSQL returns the statement that marks the live entries of keyless table t (aliased e)
// older than a snapshot ($1, 0) whose row satisfies cond deleted at ($1, 0).
func supersedeSQL(t changebatch.Table, cond string) string {
	return "update " + t.Quoted() + " as e set " + qDeleted + " = true, " + qDeletedLSN + " = $1::pg_lsn, " + qDeletedSeq + " = 0" +
		" where not e." + qDeleted + " and (e." + qLSN + ", e." + qSeq + ") < ($1::pg_lsn, 0) and (" + cond + ")"
}

// keylessColumns are the metadata columns a keyless table's target table has beyond the others.
var keylessColumns = []string{changebatch.ColRowHash, changebatch.ColOccurrence, changebatch.ColDeletedLSN, changebatch.ColDeletedSeq}

// SupersedeKeyless marks the live entries of keyless table tab older than ver = (S, 0) whose row
// satisfies cond (SQL over the target table's columns, aliased e; its arguments numbered from $2)
// deleted at ver: a snapshot at S that shows none of those rows holds their state. It first locks
// the table's fence and does nothing when the fence is at or above ver. It returns how many
// entries it marked.
func (t *Tx) SupersedeKeyless(ctx context.Context, tab changebatch.Table, ver changebatch.Version, cond string, args ...any) (int64, error) {
	fence, err := t.lockFence(ctx, tab)
	if err != nil || fence.Compare(ver) >= 0 {
		return 0, err
	}
	tag, err := t.tx.Exec(ctx, supersedeSQL(tab, cond), append([]any{ver.LSN.String()}, args...)...)
	if err != nil {
		return 0, fmt.Errorf("replace the entries of %s at %s: %w", tab, ver, err)
	}
	return tag.RowsAffected(), nil
}
