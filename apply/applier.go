package apply

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/jackc/pgerrcode"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// Result counts what applying changes did, in rows.
type Result struct {
	// Applied is the number of target rows written (inserted, updated or made tombstones).
	Applied int64
	// Suppressed is the number of staged rows not written because the target already held the
	// same or a newer version, or the version was at or below a TRUNCATE fence: replays, retries
	// and the losing side of a race between stream and backfill.
	Suppressed int64
	// Merged is the number of changes folded into a newer change of the same key in one batch.
	Merged int64
	// Truncates is the number of TRUNCATE fences applied.
	Truncates int64
	// Unknown holds the keys (values as text, in Table.KeyOrder) of the live target rows the
	// stream's changes left with unknown columns (_cdc_unknown): the source sent a TOASTed value
	// as unchanged for a row whose value the target did not hold. A read of those keys from a
	// fresh snapshot fills them (the version rule lets it).
	Unknown [][]string
}

// RowCounts are the rows an apply wrote (inserted, updated or made tombstones) and the changes the
// version rule turned into no-ops because the target held the same or a newer version: what the
// metrics count of a Result.
type RowCounts struct{ Applied, Suppressed int64 }

// Counts returns r's rows written and suppressed.
func (r Result) Counts() RowCounts { return RowCounts{Applied: r.Applied, Suppressed: r.Suppressed} }

// Add accumulates o into r.
func (r *Result) Add(o Result) {
	r.Applied += o.Applied
	r.Suppressed += o.Suppressed
	r.Merged += o.Merged
	r.Truncates += o.Truncates
	r.Unknown = append(r.Unknown, o.Unknown...)
}

// Applier writes change batches into the target over one connection, which it uses for its
// staging tables. It is not safe for concurrent use; give each worker its own Applier.
type Applier struct {
	conn   *pgx.Conn
	stages map[string]string // table (quoted) → staging table name, for committed staging tables
	// staged follows, per staging table, the rows in it as of the last commit (stageRows).
	staged map[string]stageRows
	next   int
	// copyOnly are the tables staged by COPY only, shared with the Appliers New was given it for.
	copyOnly *CopyOnlyTables
}

// New returns an Applier that writes over conn. The caller keeps ownership of conn. copyOnly is
// the set of tables to stage by COPY (CopyOnlyTables), which the Applier adds a table to when its
// inline merge fails on a value; pass one set to every Applier of a process (a daemon's sessions
// and backfill workers) so that they all stage such a table by COPY from then on. nil gives the
// Applier a set of its own.
func New(conn *pgx.Conn, copyOnly *CopyOnlyTables) *Applier {
	if copyOnly == nil {
		copyOnly = new(CopyOnlyTables)
	}
	return &Applier{conn: conn, stages: map[string]string{}, staged: map[string]stageRows{}, copyOnly: copyOnly}
}

// Tx is one target transaction: any number of batches (ApplyGroup: a stream group with its
// progress LSN), then Commit. Nothing it wrote is visible or durable before Commit returns nil.
type Tx struct {
	a         *Applier
	tx        pgx.Tx
	newStages map[string]string
	// staged is Applier.staged as this transaction leaves it, for the tables it staged rows of.
	staged map[string]stageRows
	fences map[string]changebatch.Version // fences locked by lockFence
	buf    bytes.Buffer
	// Result accumulates the counts of every Apply in this transaction.
	Result Result
}

// Begin starts a target transaction. Its BEGIN goes to the target with its first statement, in
// the same round trip (deferredTx): Begin sends nothing and its error is always nil (kept so that
// callers need not change if a BEGIN of its own comes back); a failed BEGIN is the first
// statement's error.
func (a *Applier) Begin(ctx context.Context) (*Tx, error) {
	return &Tx{a: a, tx: &deferredTx{conn: a.conn}, newStages: map[string]string{}, staged: map[string]stageRows{},
		fences: map[string]changebatch.Version{}}, nil
}

// Commit commits the transaction. Only after it returns nil may a producer confirm the positions
// the transaction covers.
func (t *Tx) Commit(ctx context.Context) error {
	if err := t.tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit target transaction: %w", err)
	}
	for k, v := range t.newStages {
		t.a.stages[k] = v
	}
	for k, st := range t.staged {
		if st.dead >= stageVacuumRows {
			// Outside a transaction, as VACUUM must be; a failure only leaves the rows for later.
			if _, err := t.a.conn.Exec(ctx, "vacuum "+pgx.Identifier{"pg_temp", t.a.stages[k]}.Sanitize()); err == nil {
				st.dead = 0
			}
		}
		t.a.staged[k] = st
	}
	return nil
}

// Rollback abandons the transaction; it is safe to call after Commit.
func (t *Tx) Rollback(ctx context.Context) error { return t.tx.Rollback(ctx) }

// Conn returns the transaction for ledger writes that must commit with the data.
func (t *Tx) Conn() pgx.Tx { return t.tx }

// pgConn returns the connection's pgconn.PgConn for a statement pgx.Tx does not offer (COPY from
// a reader) after sending the transaction's BEGIN if it was not sent yet.
func (t *Tx) pgConn(ctx context.Context) (*pgconn.PgConn, error) {
	if d, ok := t.tx.(*deferredTx); ok {
		if err := d.start(ctx); err != nil {
			return nil, err
		}
	}
	return t.tx.Conn().PgConn(), nil
}

// copyOnly returns the Applier's CopyOnlyTables as seen from the target database t writes
// (targetDatabase).
func (t *Tx) copyOnly() copyOnlyIn {
	return copyOnlyIn{set: t.a.copyOnly, db: targetDatabase(t.tx.Conn())}
}

// targetDatabase names the database conn is connected to, as it reached it: host, port and
// database name.
func targetDatabase(conn *pgx.Conn) string {
	c := conn.Config()
	return fmt.Sprintf("%s:%d/%s", c.Host, c.Port, c.Database)
}

// Apply writes one change batch with the version rule. Rows are taken in batch order; a truncate
// row splits the batch: the rows before it are merged first, then the fence is raised, then the
// rows after it. The batch stays owned by the caller.
func (t *Tx) Apply(ctx context.Context, rec arrow.RecordBatch) (Result, error) {
	var res Result
	v, err := changebatch.NewView(rec)
	if err != nil {
		return res, err
	}
	start := 0
	for i := 0; i <= v.Len(); i++ {
		if i < v.Len() && v.Op(i) != changebatch.OpTruncate {
			continue
		}
		if i > start {
			r, err := t.mergePieces(ctx, v, start, i)
			if err != nil {
				return res, err
			}
			res.Add(r)
		}
		if i < v.Len() {
			if err := t.truncate(ctx, v.Table, v.Version(i)); err != nil {
				return res, err
			}
			res.Truncates++
		}
		start = i + 1
	}
	t.Result.Add(res)
	return res, nil
}

// pieceRows and pieceBytes bound one staged merge: at most this many rows, and values of about
// this many bytes (8 MiB). A longer run of a batch's rows is merged in consecutive pieces in the
// same transaction, so what staging holds (the collapsed rows, the COPY text) stays small however
// large the batch. Pieces applied in order have the batch's outcome: each sees the target as the
// pieces before it left it, as a batch sees what earlier batches wrote.
const (
	pieceRows  = 50_000
	pieceBytes = 8 << 20
)

// mergePieces merges rows [from, to) of v in pieces (pieceRows, pieceBytes), never parting a
// key change's tombstone from its upsert (isMove).
func (t *Tx) mergePieces(ctx context.Context, v *changebatch.View, from, to int) (Result, error) {
	merge := t.merge
	if v.Table.Keyless {
		merge = t.mergeKeyless
	}
	var res Result
	for from < to {
		end, bytes := from, 0
		for end < to && end-from < pieceRows && bytes < pieceBytes {
			bytes += v.RowBytes(end)
			end++
		}
		for end < to && isMove(v, end) {
			end++
		}
		r, err := merge(ctx, v, from, end)
		if err != nil {
			return res, err
		}
		res.Add(r)
		from = end
	}
	return res, nil
}

// merge stages rows [from, to) of v and upserts them into the target table.
// It first locks the table's fence row (lockFence): a backfill completing concurrently raises the
// fence and turns older rows into tombstones only after this transaction ended, so it sees the
// rows written here.
func (t *Tx) merge(ctx context.Context, v *changebatch.View, from, to int) (Result, error) {
	if _, err := t.lockFence(ctx, v.Table); err != nil {
		return Result{}, err
	}
	rows, merged := collapse(v, from, to)
	movedUnknown, unchanged := false, false
	for i := range rows {
		if rows[i].from != nil {
			if err := t.lookupMoved(ctx, v.Table, &rows[i]); err != nil {
				return Result{}, err
			}
		}
		movedUnknown = movedUnknown || rows[i].moved && anyUnchanged(rows[i].values)
		unchanged = unchanged || anyUnchanged(rows[i].values)
	}
	src := source{records: inlineRecords(t.copyOnly(), v.Table, rows)}
	var err error
	if src.records != nil {
		src.stage, err = t.ensureStage(ctx, v.Table)
	} else {
		src.stage, err = t.stage(ctx, v.Table, len(rows))
	}
	if err != nil {
		return Result{}, err
	}
	if src.records == nil {
		t.buf.Reset()
		encodeCopyText(&t.buf, v.Table, rows)
		pc, err := t.pgConn(ctx)
		if err != nil {
			return Result{}, err
		}
		if _, err := pc.CopyFrom(ctx, bytes.NewReader(t.buf.Bytes()), copySQL(v.Table, src.stage)); err != nil {
			return Result{}, fmt.Errorf("stage %d rows of %s: %w", len(rows), v.Table, describeCopyError(v.Table, rows, err))
		}
	}
	var applied int64
	for _, moved := range []bool{false, true} {
		if moved && !movedUnknown {
			break
		}
		sql, args := upsertSQL(v.Table, src, moved)
		tag, err := t.tx.Exec(ctx, sql, args...)
		if err != nil {
			return Result{}, upsertError(t.copyOnly(), v.Table, len(rows), src, err)
		}
		applied += tag.RowsAffected()
	}
	res := Result{Applied: applied, Suppressed: int64(len(rows)) - applied, Merged: int64(merged)}
	if unchanged {
		var err error
		if res.Unknown, err = t.unknownKeys(ctx, v.Table, src); err != nil {
			return Result{}, err
		}
	}
	return res, nil
}

// upsertError describes err, the failed upsert of n rows into tab from src; a value an inline
// merge failed on marks tab in copyOnly (noteInlineError).
func upsertError(copyOnly copyOnlyIn, tab changebatch.Table, n int, src source, err error) error {
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == pgerrcode.InvalidColumnReference {
		// ON CONFLICT found no key to arbitrate on (bulkkey.go).
		return fmt.Errorf("upsert %d rows into %s: the target table has no primary key, because a bulk load of it is under way and builds the key when it completes (or one was interrupted, and the next backfill or daemon start builds it); this is retried: %w",
			n, tab, err)
	}
	if src.records != nil {
		err = noteInlineError(copyOnly, tab, err)
	}
	return fmt.Errorf("upsert %d rows into %s: %w", n, tab, describeConstraint(err))
}

// unknownKeys returns the keys (text, in KeyOrder) of the staged rows whose live target row has
// unknown columns after the merge.
func (t *Tx) unknownKeys(ctx context.Context, tab changebatch.Table, src source) ([][]string, error) {
	var keys, texts []string
	for _, i := range tab.KeyOrder() {
		q := pgx.Identifier{tab.Columns[i].Name}.Sanitize()
		keys, texts = append(keys, q), append(texts, "tgt."+q+"::text")
	}
	k := "(" + strings.Join(keys, ", ") + ")"
	from, args := src.from(nil)
	rows, err := t.tx.Query(ctx, "select "+strings.Join(texts, ", ")+" from "+tab.Quoted()+" as tgt where tgt."+qUnknown+
		" is not null and not tgt."+qDeleted+" and "+k+" in (select "+strings.Join(keys, ", ")+" from "+from+")", args...)
	if err != nil {
		return nil, fmt.Errorf("look up the rows of %s left with unknown values: %w", tab, err)
	}
	defer rows.Close()
	var out [][]string
	for rows.Next() {
		key := make([]string, len(keys))
		for i, r := range rows.RawValues() {
			key[i] = string(r)
		}
		out = append(out, key)
	}
	return out, rows.Err()
}

// describeConstraint returns err, a violation of one of the target's integrity constraints (SQLSTATE
// class 23: a CHECK, unique index, foreign key or NOT NULL the source's row does not meet), with
// the constraint, the row the server names (its Detail) and the fix; other errors unchanged.
func describeConstraint(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || !strings.HasPrefix(pgErr.Code, "23") {
		return err
	}
	table := pgx.Identifier{pgErr.SchemaName, pgErr.TableName}.Sanitize()
	what, fix := "a constraint", "ALTER TABLE "+table+" DROP CONSTRAINT …"
	if c := pgErr.ConstraintName; c != "" {
		what = fmt.Sprintf("constraint %q", c)
		fix = "ALTER TABLE " + table + " DROP CONSTRAINT " + pgx.Identifier{c}.Sanitize()
		if pgErr.Code == pgerrcode.UniqueViolation {
			what = fmt.Sprintf("unique index %q", c)
			fix = "DROP INDEX " + pgx.Identifier{pgErr.SchemaName, c}.Sanitize() + ", or ALTER TABLE " + table + " DROP CONSTRAINT " + pgx.Identifier{c}.Sanitize() + " when a constraint owns the index"
		}
	}
	detail := ""
	if pgErr.Detail != "" {
		detail = " (" + pgErr.Detail + ")"
	}
	return fmt.Errorf("the target refused a source row by %s of %s%s: the target has a constraint the source's rows do not meet; change or drop it on the target (%s), and the same changes are applied then, none skipped: %w",
		what, table, detail, fix, err)
}

// lookupMoved fills the unchanged columns of moved row r from the newest live target row among
// the keys its value moved through (r.from), each within the versions the value stayed at that
// key; what none knows stays unknown.
func (t *Tx) lookupMoved(ctx context.Context, tab changebatch.Table, r *stagedRow) error {
	var names []string
	var idx []int
	for i, c := range tab.Columns {
		if !c.Key {
			names, idx = append(names, c.Name), append(idx, i)
		}
	}
	var best *movedSource
	for _, from := range r.from {
		src, err := t.lookupOne(ctx, tab, from, len(names))
		if err != nil {
			return err
		}
		if src != nil && (best == nil || src.version.Compare(best.version) > 0) {
			best = src
		}
	}
	r.from = nil
	if best == nil {
		return nil
	}
	for j, i := range idx {
		if !r.values[i].Unchanged || slices.Contains(best.unknown, names[j]) {
			continue
		}
		if best.vals[j] == nil {
			r.values[i] = changebatch.Value{Null: true}
		} else {
			r.values[i] = changebatch.Value{Text: *best.vals[j]}
		}
	}
	return nil
}

// movedSource is a target row that may supply the unchanged columns of a moved row.
type movedSource struct {
	vals    []*string // non-key columns as text, nil for NULL
	unknown []string
	version changebatch.Version
}

// lookupOne reads the live target row of from.key with a version in [from.arrived, from.left), or
// returns nil.
func (t *Tx) lookupOne(ctx context.Context, tab changebatch.Table, from moveSource, n int) (*movedSource, error) {
	var args []any
	for i, c := range tab.Columns {
		if c.Key {
			args = append(args, from.key[i].Text)
		}
	}
	args = append(args, from.left.LSN.String(), int64(from.left.Seq), from.arrived.LSN.String(), int64(from.arrived.Seq))
	src := &movedSource{vals: make([]*string, n)}
	var lsn string
	var seq int64
	dest := make([]any, 0, n+3)
	for i := range src.vals {
		dest = append(dest, &src.vals[i])
	}
	dest = append(dest, &src.unknown, &lsn, &seq)
	err := t.tx.QueryRow(ctx, lookupSQL(tab), args...).Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the old row of a key change in %s: %w", tab, err)
	}
	l, err := pglogrepl.ParseLSN(lsn)
	if err != nil {
		return nil, fmt.Errorf("read the old row of a key change in %s: %w", tab, err)
	}
	src.version = changebatch.Version{LSN: l, Seq: uint64(seq)}
	return src, nil
}

// Staging tables are temporary tables that keep their rows at commit: ON COMMIT DELETE ROWS
// would truncate every one of the session's staging tables at every commit that touches any
// temporary table, about 0.5–1 ms each (4.4 ms a commit for pgbench's four tables, the larger
// part of a small group's apply, and growing with the tables followed). A staging table is
// emptied at its next use instead: by DELETE, cheap for the few rows of a group near the head of
// the stream, or by TRUNCATE after a large batch (stageTruncateRows). DELETE leaves dead rows
// that the next merges would scan; a VACUUM after the commit that brings them to stageVacuumRows
// removes them, without TRUNCATE's new file and catalog update.
const (
	stageTruncateRows = 5000
	stageVacuumRows   = 2000
)

// stageRows is what a staging table holds: live, the rows of its last use, still there unless a
// later use in the same transaction emptied it; dead, the rows deleted since its last VACUUM or
// TRUNCATE.
type stageRows struct{ live, dead int }

// stage returns the name of the staging table for table tab (ensureStage), emptied of what
// earlier merges staged (stageRows), for rows more rows.
func (t *Tx) stage(ctx context.Context, tab changebatch.Table, rows int) (string, error) {
	name, err := t.ensureStage(ctx, tab)
	if err != nil {
		return "", err
	}
	key := tab.String()
	st, ok := t.staged[key]
	if !ok {
		st = t.a.staged[key]
	}
	q := pgx.Identifier{"pg_temp", name}.Sanitize()
	switch {
	case st.live >= stageTruncateRows:
		if _, err := t.tx.Exec(ctx, "truncate "+q); err != nil {
			return "", fmt.Errorf("empty staging table for %s: %w", tab, err)
		}
		st = stageRows{}
	case st.live > 0:
		// Rows an earlier merge staged (committed or, in this transaction, not).
		if _, err := t.tx.Exec(ctx, "delete from "+q); err != nil {
			return "", fmt.Errorf("empty staging table for %s: %w", tab, err)
		}
		st.dead += st.live
	}
	st.live = rows
	t.staged[key] = st
	return name, nil
}

// ensureStage returns the name of the staging table for table tab, creating it in this session
// if needed. An inline merge uses it as its rows' type only (inline.go).
func (t *Tx) ensureStage(ctx context.Context, tab changebatch.Table) (string, error) {
	key := tab.String()
	if name, ok := t.a.stages[key]; ok {
		return name, nil
	}
	if name, ok := t.newStages[key]; ok {
		return name, nil
	}
	t.a.next++
	name := "pgconverge_stage_" + strconv.Itoa(t.a.next)
	ddl := createStageSQL(tab, name)
	if tab.Keyless {
		ddl = keylessStageSQL(tab, name)
	}
	if _, err := t.tx.Exec(ctx, ddl); err != nil {
		return "", fmt.Errorf("create staging table for %s: %w", tab, err)
	}
	t.newStages[key] = name
	return name, nil
}

// Fence raises tab's fence to ver, so that no version at or below it is ever written again, and
// turns every live row older than ver into a tombstone at ver; it returns how many rows it turned.
// A TRUNCATE at ver does this. So does a completed snapshot load at S with ver (S, 0): every row
// the snapshot showed then has version (S, 0) or newer, an older live row is one the source deleted
// before S, and any older change still to arrive (a stream resumed from before S) is already
// reflected in the snapshot or was undone before S.
func (t *Tx) Fence(ctx context.Context, tab changebatch.Table, ver changebatch.Version) (int64, error) {
	if err := t.RaiseFence(ctx, tab, ver); err != nil {
		return 0, err
	}
	if tab.Keyless {
		var turned int64
		for i, sql := range keylessFenceSQL(tab) {
			tag, err := t.tx.Exec(ctx, sql, ver.LSN.String(), int64(ver.Seq))
			if err != nil {
				return 0, fmt.Errorf("tombstone rows of %s before %s: %w", tab, ver, err)
			}
			if i == 0 {
				turned = tag.RowsAffected()
			}
		}
		return turned, nil
	}
	tag, err := t.tx.Exec(ctx, tombstoneBeforeSQL(tab), ver.LSN.String(), int64(ver.Seq))
	if err != nil {
		return 0, fmt.Errorf("tombstone rows of %s before %s: %w", tab, ver, err)
	}
	return tag.RowsAffected(), nil
}

// truncate applies a streamed TRUNCATE at ver: the fence, and the ledger's record that history
// before it is void (pgconverge.tables.truncated_lsn, which the coverage ledger counts as covered).
func (t *Tx) truncate(ctx context.Context, tab changebatch.Table, ver changebatch.Version) error {
	if _, err := t.Fence(ctx, tab, ver); err != nil {
		return err
	}
	_, err := t.tx.Exec(ctx, `update pgconverge.tables set truncated_lsn = greatest(truncated_lsn, $3::pg_lsn)
where schema_name = $1 and table_name = $2`, tab.Schema, tab.Name, ver.LSN.String())
	if err != nil {
		return fmt.Errorf("record truncate of %s at %s: %w", tab, ver, err)
	}
	return nil
}

// RaiseFence raises tab's fence to ver, so that no version at or below it is ever written again,
// without touching the table's rows: Fence without its tombstones, for a caller that knows the
// table holds no live row older than ver.
func (t *Tx) RaiseFence(ctx context.Context, tab changebatch.Table, ver changebatch.Version) error {
	if err := RaiseFenceTx(ctx, t.tx, tab.TableName, ver); err != nil {
		return err
	}
	delete(t.fences, tab.String())
	return nil
}

// RaiseFenceTx is Tx.RaiseFence in a transaction of the caller's: it raises table tab's fence to
// ver (never lowers it), waiting for the writers that hold the fence row.
func RaiseFenceTx(ctx context.Context, tx pgx.Tx, tab changebatch.TableName, ver changebatch.Version) error {
	if _, err := tx.Exec(ctx, fenceSQL, tab.Schema, tab.Name, ver.LSN.String(), int64(ver.Seq)); err != nil {
		return fmt.Errorf("raise fence of %s to %s: %w", tab, ver, err)
	}
	return nil
}
