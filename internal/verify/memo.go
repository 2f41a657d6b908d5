package verify

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/reconcile"
)

// identitySQL names, on one side, the cluster (system identifier and current timeline, on a
// standby in recovery the timeline of its last restartpoint), the
// table's oid and its columns' names, types and collations (with an enum's labels, which a rename
// changes without touching a row): NULL when the role may not read the cluster's control data.
// A memo is used only under the same identity on both sides: another cluster, a restore (a new
// timeline), a table dropped and created again or a column changed makes verify hash everything.
const identitySQL = `select case when has_function_privilege('pg_control_system()', 'execute') then
  (select system_identifier::text from pg_control_system()) || '/' ||
  case when pg_is_in_recovery() then (select lpad(upper(to_hex(timeline_id)), 8, '0') from pg_control_checkpoint())
    else substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) end || '/' ||
  $1::regclass::oid::text || '/' || coalesce((select string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod) || ' ' ||
    a.attcollation::text || coalesce(' ' || (select string_agg(e.enumlabel, ',' order by e.enumtypid, e.enumsortorder) from pg_enum e
      where e.enumtypid in (a.atttypid, ty.typelem, ty.typbasetype)), ''), ';' order by a.attnum)
    from pg_attribute a join pg_type ty on ty.oid = a.atttypid where a.attrelid = $1::regclass and a.attnum > 0 and not a.attisdropped), '')
  end`

// identity returns both sides' identity of table t (identitySQL), "" when a side cannot tell;
// tgt is a target connection outside the comparison's transaction, which an error would abort.
func identity(ctx context.Context, stx, tgt reconcile.Querier, t changebatch.Table) (string, error) {
	var srcID, tgtID *string
	if err := stx.QueryRow(ctx, identitySQL, t.Quoted()).Scan(&srcID); err != nil {
		return "", fmt.Errorf("read the identity of %s on the source: %w", t, err)
	}
	if err := tgt.QueryRow(ctx, identitySQL, t.Quoted()).Scan(&tgtID); err != nil {
		return "", fmt.Errorf("read the identity of %s on the target: %w", t, err)
	}
	if srcID == nil || tgtID == nil {
		return "", nil
	}
	return "source " + *srcID + "\ntarget " + *tgtID, nil
}

// loadMemo returns table t's memo if it was taken under identity id at a snapshot at or before
// snap, else nil and why not.
func (v *verifyRun) loadMemo(ctx context.Context, t changebatch.Table, id string, snap pglogrepl.LSN) (*reconcile.Memo, string, error) {
	if id == "" {
		return nil, "the clusters' identity is not readable (pg_control_system)", nil
	}
	var m reconcile.Memo
	var memoID, lsn string
	var sx, tx string
	var ids, srcRows, tgtTuples []int64
	var equal []bool
	err := v.led.QueryRow(ctx, `select identity, snapshot_lsn::text, shape, bits, source_xmin::text, target_xmin::text, source_rows, target_tuples,
  group_ids, group_source_rows, group_target_tuples, group_equal from pgconverge.verify_memos where table_name = $1`, t.TableName.String()).
		Scan(&memoID, &lsn, &m.Shape, &m.Bits, &sx, &tx, &m.SourceRows, &m.TargetTuples, &ids, &srcRows, &tgtTuples, &equal)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, "no earlier verify of the table to build on", nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("read the verify memo of %s: %w", t, err)
	}
	at, err := pglogrepl.ParseLSN(lsn)
	if err != nil {
		return nil, "", fmt.Errorf("read the verify memo of %s: %w", t, err)
	}
	switch {
	case memoID != id:
		return nil, "a cluster, the table or its columns changed since the last verify", nil
	case at > snap:
		return nil, "the last verify's snapshot is newer than this one's", nil
	case len(srcRows) != len(ids) || len(tgtTuples) != len(ids) || len(equal) != len(ids):
		return nil, "", fmt.Errorf("read the verify memo of %s: %d groups with %d, %d and %d values", t, len(ids), len(srcRows), len(tgtTuples), len(equal))
	}
	if _, err := fmt.Sscan(sx, &m.SourceXmin); err != nil {
		return nil, "", fmt.Errorf("read the verify memo of %s: source xmin %q: %w", t, sx, err)
	}
	if _, err := fmt.Sscan(tx, &m.TargetXmin); err != nil {
		return nil, "", fmt.Errorf("read the verify memo of %s: target xmin %q: %w", t, tx, err)
	}
	m.Groups = make(map[int64]reconcile.MemoGroup, len(ids))
	for i, g := range ids {
		m.Groups[g] = reconcile.MemoGroup{SourceRows: srcRows[i], TargetTuples: tgtTuples[i], Equal: equal[i]}
	}
	return &m, "", nil
}

// saveMemo records m, table t's groups found equal at the run's snapshot, under identity id.
func (v *verifyRun) saveMemo(ctx context.Context, t changebatch.Table, id string, m *reconcile.Memo) error {
	if id == "" || m == nil {
		return nil
	}
	ids := make([]int64, 0, len(m.Groups))
	srcRows := make([]int64, 0, len(m.Groups))
	tgtTuples := make([]int64, 0, len(m.Groups))
	equal := make([]bool, 0, len(m.Groups))
	for g, c := range m.Groups {
		ids = append(ids, g)
		srcRows = append(srcRows, c.SourceRows)
		tgtTuples = append(tgtTuples, c.TargetTuples)
		equal = append(equal, c.Equal)
	}
	_, err := v.led.Exec(ctx, `insert into pgconverge.verify_memos as m (table_name, run_id, snapshot_lsn, identity, shape, bits, source_xmin, target_xmin,
  source_rows, target_tuples, group_ids, group_source_rows, group_target_tuples, group_equal)
values ($1, $2, $3::pg_lsn, $4, $5, $6, $7::text::xid8, $8::text::xid8, $9, $10, $11, $12, $13, $14)
on conflict (table_name) do update set run_id = excluded.run_id, snapshot_lsn = excluded.snapshot_lsn, identity = excluded.identity,
  shape = excluded.shape, bits = excluded.bits, source_xmin = excluded.source_xmin, target_xmin = excluded.target_xmin,
  source_rows = excluded.source_rows, target_tuples = excluded.target_tuples, group_ids = excluded.group_ids,
  group_source_rows = excluded.group_source_rows, group_target_tuples = excluded.group_target_tuples, group_equal = excluded.group_equal,
  updated_at = now()
where m.snapshot_lsn <= excluded.snapshot_lsn`,
		t.TableName.String(), v.runID, v.snap.LSN.String(), id, m.Shape, m.Bits, fmt.Sprint(m.SourceXmin), fmt.Sprint(m.TargetXmin),
		m.SourceRows, m.TargetTuples, ids, srcRows, tgtTuples, equal)
	if err != nil {
		return fmt.Errorf("record the verify memo of %s: %w", t, err)
	}
	return nil
}

// dropMemo deletes table t's memo: the next verify of it hashes every group.
func (v *verifyRun) dropMemo(ctx context.Context, t changebatch.Table) error {
	if _, err := v.led.Exec(ctx, `delete from pgconverge.verify_memos where table_name = $1`, t.TableName.String()); err != nil {
		return fmt.Errorf("delete the verify memo of %s: %w", t, err)
	}
	return nil
}
