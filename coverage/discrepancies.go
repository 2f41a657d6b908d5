package coverage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// Ledger rows of verify (migrations/005_verify.sql): runs and the discrepancies they find.

// Verify run triggers, as stored in pgconverge.verify_runs.trigger.
const (
	VerifyManual   = "manual"
	VerifySchedule = "schedule"
)

// How an open discrepancy was closed (pgconverge.discrepancies.remediation).
const (
	RemediationRepaired   = "repaired"
	RemediationEqual      = "equal"
	RemediationSuperseded = "superseded"
)

// Discrepancy is one key whose target row disagreed with the source at snapshot S.
type Discrepancy struct {
	Table changebatch.TableName
	// KeyColumns and Key are the key's column names and values as text, in the key's order.
	KeyColumns, Key []string
	// Kind is "missing", "extra" or "different".
	Kind string
	// SourceHash and TargetHash are the rows' hashes, "" where that side has no live row.
	SourceHash, TargetHash string
	// TargetVersion is the target row's version (zero: no row); TargetDeleted marks a tombstone.
	TargetVersion changebatch.Version
	TargetDeleted bool
}

// ID is the discrepancy's id: 32 hex digits of SHA-256 over the table's qualified name, the key
// (column names and values), the source row's hash, the target row's hash and the target row's
// version (LSN, seq, tombstone or not), each length-prefixed. It is a pure function of those
// inputs (never a clock, a random value or an attempt counter), so the same drift seen again gets
// the same id; the kind follows from the inputs (no source hash: extra; no target hash: missing).
func (d Discrepancy) ID() string {
	h := sha256.New()
	put := func(s string) { fmt.Fprintf(h, "%d:%s;", len(s), s) }
	put(d.Table.String())
	for i := range d.Key {
		put(d.KeyColumns[i])
		put(d.Key[i])
	}
	put(d.SourceHash)
	put(d.TargetHash)
	put(d.TargetVersion.String())
	if d.TargetDeleted {
		put("tombstone")
	} else {
		put("")
	}
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// keyJSON renders the key as a JSON object, column name → value text.
func (d Discrepancy) keyJSON() string {
	m := make(map[string]string, len(d.Key))
	for i := range d.Key {
		m[d.KeyColumns[i]] = d.Key[i]
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// StartVerifyRun records a running verify run and returns its id.
func StartVerifyRun(ctx context.Context, conn *pgx.Conn, trigger string) (int64, error) {
	var id int64
	err := conn.QueryRow(ctx, `insert into pgconverge.verify_runs (trigger, status) values ($1, 'running') returning id`, trigger).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("record a verify run: %w", err)
	}
	return id, nil
}

// VerifyRunEnd is what a verify run records when it ends.
type VerifyRunEnd struct {
	Snapshot, Repair      pglogrepl.LSN
	HashMode              string
	Tables                int
	Found, Repaired, Open int64
	Err                   error
}

// EndVerifyRun records the end of run id: completed, or failed with e.Err.
func EndVerifyRun(ctx context.Context, conn *pgx.Conn, id int64, e VerifyRunEnd) error {
	status, msg := "completed", (*string)(nil)
	if e.Err != nil {
		status = "failed"
		s := e.Err.Error()
		msg = &s
	}
	lsn := func(l pglogrepl.LSN) *string {
		if l == 0 {
			return nil
		}
		s := l.String()
		return &s
	}
	_, err := conn.Exec(ctx, `update pgconverge.verify_runs set status = $2, snapshot_lsn = $3::pg_lsn, repair_lsn = $4::pg_lsn,
  hash_mode = $5, tables = $6, found = $7, repaired = $8, open = $9, error = $10, finished_at = now() where id = $1`,
		id, status, lsn(e.Snapshot), lsn(e.Repair), e.HashMode, e.Tables, e.Found, e.Repaired, e.Open, msg)
	if err != nil {
		return fmt.Errorf("record the end of verify run %d: %w", id, err)
	}
	return nil
}

// RecordDiscrepancies upserts ds (found by run runID at snapshot s) on their ids in one
// statement: a new id is inserted; a known one only moves last_seen, last_run, last_snapshot_lsn
// and seen, and is opened again if it was closed. Any other open discrepancy of the same key is
// closed as superseded. The known ones are recorded, per table, in the audit of suppressed
// replays (path verify, from the snapshot they were first found at to s) by the same statement,
// so in the same target transaction. It returns how many ids were new and how many were known
// already (a replayed or repeated run's, suppressed).
func RecordDiscrepancies(ctx context.Context, conn *pgx.Conn, runID int64, s pglogrepl.LSN, ds []Discrepancy) (inserted, known int64, err error) {
	if len(ds) == 0 {
		return 0, 0, nil
	}
	n := len(ds)
	ids, tables, keys, kinds := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	srcH, tgtH, tgtLSN := make([]*string, n), make([]*string, n), make([]*string, n)
	tgtSeq, deleted := make([]*int64, n), make([]bool, n)
	for i, d := range ds {
		ids[i], tables[i], keys[i], kinds[i] = d.ID(), d.Table.String(), d.keyJSON(), d.Kind
		srcH[i], tgtH[i] = nonEmpty(d.SourceHash), nonEmpty(d.TargetHash)
		if d.TargetVersion != (changebatch.Version{}) {
			l, q := d.TargetVersion.LSN.String(), int64(d.TargetVersion.Seq)
			tgtLSN[i], tgtSeq[i] = &l, &q
		}
		deleted[i] = d.TargetDeleted
	}
	rows, err := conn.Query(ctx, `with found as (
  select * from unnest($1::text[], $2::text[], $3::jsonb[], $4::text[], $5::text[], $6::text[], $7::pg_lsn[], $8::int8[], $9::bool[])
    as f(id, table_name, key, kind, source_hash, target_hash, target_lsn, target_seq, target_deleted)
), superseded as (
  update pgconverge.discrepancies d set remediated_at = now(), remediation = 'superseded'
  from found f where d.table_name = f.table_name and d.key = f.key and d.id <> f.id and d.remediated_at is null
), upserted as (
  insert into pgconverge.discrepancies as d (id, table_name, key, kind, snapshot_lsn, last_snapshot_lsn, source_hash, target_hash,
    target_lsn, target_seq, target_deleted, first_run, last_run)
  select id, table_name, key, kind, $10::pg_lsn, $10::pg_lsn, source_hash, target_hash, target_lsn, target_seq, target_deleted, $11, $11 from found
  on conflict (id) do update set last_seen = now(), last_run = excluded.last_run, last_snapshot_lsn = excluded.last_snapshot_lsn,
    seen = d.seen + 1, remediated_at = null, remediation = null, repair_lsn = null
  returning d.table_name, d.snapshot_lsn, xmax = 0 as is_new
), audited as (
  insert into pgconverge.suppressed_replays (path, verify_run, table_name, first_lsn, last_lsn, rows_offered, rows_suppressed)
  select 'verify', $11, table_name, min(snapshot_lsn) filter (where not is_new), $10::pg_lsn, count(*), count(*) filter (where not is_new)
  from upserted group by table_name having bool_or(not is_new)
)
select is_new from upserted`, ids, tables, keys, kinds, srcH, tgtH, tgtLSN, tgtSeq, deleted, s.String(), runID)
	if err != nil {
		return 0, 0, fmt.Errorf("record %d discrepancies: %w", n, err)
	}
	for rows.Next() {
		var isNew bool
		if err := rows.Scan(&isNew); err != nil {
			rows.Close()
			return 0, 0, fmt.Errorf("record %d discrepancies: %w", n, err)
		}
		if isNew {
			inserted++
		} else {
			known++
		}
	}
	rows.Close()
	err = rows.Err()
	if err != nil {
		return 0, 0, fmt.Errorf("record %d discrepancies: %w", n, err)
	}
	return inserted, known, nil
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// OpenDiscrepancy is an open discrepancy as read back: its id, key (in key order), kind and
// whether it lacks its values.
type OpenDiscrepancy struct {
	ID       string
	Key      []string
	Kind     string
	LastRun  int64
	NoValues bool
}

// OpenDiscrepancies returns the open discrepancies of table t, whose key columns are keyCols, in
// id order, at most limit of them after id after ("" from the start).
func OpenDiscrepancies(ctx context.Context, conn *pgx.Conn, t changebatch.TableName, keyCols []string, after string, limit int) ([]OpenDiscrepancy, error) {
	var sel []string
	for i := range keyCols {
		sel = append(sel, fmt.Sprintf("key->>$%d", i+4))
	}
	args := []any{t.String(), after, limit}
	for _, c := range keyCols {
		args = append(args, c)
	}
	rows, err := conn.Query(ctx, `select id, kind, coalesce(last_run, 0), source_values is null and target_values is null, array[`+strings.Join(sel, ", ")+`]::text[]
from pgconverge.discrepancies where table_name = $1 and remediated_at is null and id > $2 order by id limit $3`, args...)
	if err != nil {
		return nil, fmt.Errorf("read the open discrepancies of %s: %w", t, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (OpenDiscrepancy, error) {
		var d OpenDiscrepancy
		err := r.Scan(&d.ID, &d.Kind, &d.LastRun, &d.NoValues, &d.Key)
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the open discrepancies of %s: %w", t, err)
	}
	return out, nil
}

// SetDiscrepancyValues records the rows' values (column → text, nil for a side without a row) of
// discrepancy id.
func SetDiscrepancyValues(ctx context.Context, conn *pgx.Conn, id string, source, target map[string]*string) error {
	enc := func(m map[string]*string) any {
		if m == nil {
			return nil
		}
		return m
	}
	_, err := conn.Exec(ctx, `update pgconverge.discrepancies set source_values = $2, target_values = $3 where id = $1`, id, enc(source), enc(target))
	if err != nil {
		return fmt.Errorf("record the values of discrepancy %s: %w", id, err)
	}
	return nil
}

// CloseDiscrepancies closes the open discrepancies ids as remediation (RemediationRepaired with
// repair, the snapshot S' the repair read; RemediationEqual with 0), in the caller's transaction
// q (the repair's own, so a repair and its record commit together). It returns how many it closed.
func CloseDiscrepancies(ctx context.Context, q Execer, ids []string, remediation string, repair pglogrepl.LSN) (int64, error) {
	var lsn *string
	if repair != 0 {
		s := repair.String()
		lsn = &s
	}
	tag, err := q.Exec(ctx, `update pgconverge.discrepancies set remediated_at = now(), remediation = $2, repair_lsn = $3::pg_lsn
where id = any($1) and remediated_at is null`, ids, remediation, lsn)
	if err != nil {
		return 0, fmt.Errorf("close %d discrepancies as %s: %w", len(ids), remediation, err)
	}
	return tag.RowsAffected(), nil
}

// Execer is what the ledger's writers need of a connection or transaction: pgx.Tx and *pgx.Conn
// have it.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// CountOpenDiscrepancies returns the open discrepancies of table t.
func CountOpenDiscrepancies(ctx context.Context, conn *pgx.Conn, t changebatch.TableName) (int64, error) {
	var n int64
	err := conn.QueryRow(ctx, `select count(*) from pgconverge.discrepancies where table_name = $1 and remediated_at is null`, t.String()).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count the open discrepancies of %s: %w", t, err)
	}
	return n, nil
}
