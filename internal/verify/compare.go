package verify

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/backfill"
	"github.com/pgconverge/pgconverge/coverage"
	"github.com/pgconverge/pgconverge/internal/reconcile"
)

// compare compares one table at the run's snapshot with the target as ttx shows it, records what it finds and closes what it
// finds equal.
func (v *verifyRun) compare(ctx context.Context, ttx pgx.Tx, t *verifyTable) error {
	// A transaction per table, so a table is locked against rewrites only while it is compared.
	stx, err := backfill.BeginSnapshot(ctx, v.src, v.snap, t.Table)
	if err != nil {
		return fmt.Errorf("read %s at snapshot %s: %w", t, v.snap.LSN, err)
	}
	defer stx.Rollback(context.WithoutCancel(ctx))
	if err := v.checkTarget(ctx, ttx, t); err != nil {
		return err
	}
	keyCols := discrepancyKeyColumns(t.Table)
	inc, id, err := v.incremental(ctx, stx, t)
	if err != nil {
		return err
	}
	var found []coverage.Discrepancy
	st, err := reconcile.Compare(ctx, stx, ttx, reconcile.Config{
		Table: t.Table, Snapshot: v.snap.LSN, Mode: v.mode, LeafRows: v.cfg.LeafRows, Incremental: inc, Pace: v.cfg.Pacer.Take,
		Emit: func(ctx context.Context, diffs []reconcile.Diff) error {
			batch := make([]coverage.Discrepancy, len(diffs))
			for i, d := range diffs {
				batch[i] = coverage.Discrepancy{Table: t.TableName, KeyColumns: keyCols, Key: d.Key, Kind: string(d.Kind),
					SourceHash: d.SourceHash, TargetHash: d.TargetHash, TargetVersion: d.TargetVersion, TargetDeleted: d.TargetDeleted}
			}
			inserted, known, err := coverage.RecordDiscrepancies(ctx, v.led, v.runID, v.snap.LSN, batch)
			t.rep.New += inserted
			if known > 0 {
				v.cfg.Monitor.DiscrepanciesSuppressed(t.rep.Table, known)
			}
			found = append(found, batch...)
			return err
		},
	})
	r := t.rep
	r.SourceRows, r.RowsCompared, r.MovedOn = st.SourceRows, st.Compared, st.Moved
	r.RangesChecked, r.RowsFetched, r.BytesFetched = st.Groups, st.RowsFetched, st.BytesFetched
	r.GroupsSkipped = st.Skipped
	if inc != nil && inc.Previous != nil && st.Memo != nil && !st.MemoUsed {
		r.FullReason = "the last verify's memo does not apply (other hashes, or its snapshots are too far back in transaction ids)"
	}
	for k, n := range st.Found {
		r.Found[string(k)] = n
		v.cfg.Monitor.DiscrepanciesFound(r.Table, string(k), n)
	}
	if err != nil {
		return err
	}
	if err := v.saveMemo(ctx, t.Table, id, st.Memo); err != nil {
		return err
	}
	if !v.cfg.NoValues && !t.Keyless { // a keyless table's discrepancy names a value by its hashes
		if err := v.recordValues(ctx, stx, ttx, t, found); err != nil {
			return err
		}
	}
	return v.closeEqual(ctx, ttx, t, keyCols)
}

// checkTarget checks, in the comparison's target transaction, that the stream had passed S and
// the table was loaded then, and that the target table has the source's columns.
func (v *verifyRun) checkTarget(ctx context.Context, ttx pgx.Tx, t *verifyTable) error {
	st, err := coverage.ReadStreamState(ctx, ttx, t.TableName, t.slot, v.snap.LSN)
	if err != nil {
		return err
	}
	if !st.Passed {
		applied := st.Applied
		if applied == "" {
			applied = "nothing"
		}
		return fmt.Errorf("the stream of slot %q fell behind the snapshot %s (applied %s)", t.slot, v.snap.LSN, applied)
	}
	if !st.Loaded {
		return errSkip("being loaded again: verify it once `pgconverge run` has loaded it")
	}
	missing, err := missingColumns(ctx, ttx, t.Table)
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		return errSkip(fmt.Sprintf("the target table lacks source columns %q: a schema change is not applied yet; verify it once `pgconverge run` has followed it", missing))
	}
	return nil
}

// missingColumns returns the columns of source table t that target table t lacks, read over q.
func missingColumns(ctx context.Context, q reconcile.Querier, t changebatch.Table) ([]string, error) {
	var missing []string
	for _, c := range t.Columns {
		var has bool
		err := q.QueryRow(ctx, `select exists (select 1 from pg_attribute where attrelid = $1::regclass and attname = $2 and attnum > 0 and not attisdropped)`,
			t.Quoted(), c.Name).Scan(&has)
		if err != nil {
			return nil, fmt.Errorf("read the columns of %s on the target: %w", t, err)
		}
		if !has {
			missing = append(missing, c.Name)
		}
	}
	return missing, nil
}

// incremental returns how t is compared: incrementally from its memo when one applies (nil
// Previous: the whole table is checksummed, t.rep.FullReason says why), and both sides' identity
// the new memo is recorded under. A table reconcile cannot compare incrementally gets nil.
func (v *verifyRun) incremental(ctx context.Context, stx pgx.Tx, t *verifyTable) (*reconcile.Incremental, string, error) {
	if t.Keyless || t.Partitioned || t.RowFilter != "" {
		t.rep.FullReason = "keyless, partitioned or row-filtered tables are always compared in full"
		return nil, "", nil
	}
	id, err := identity(ctx, stx, v.led, t.Table)
	if err != nil {
		return nil, "", err
	}
	inc := &reconcile.Incremental{Bits: v.cfg.GroupBits, Whole: true}
	if !v.cfg.Incremental {
		t.rep.FullReason = "not incremental (no --incremental)"
		return inc, id, nil
	}
	prev, why, err := v.loadMemo(ctx, t.Table, id, v.snap.LSN)
	if err != nil {
		return nil, "", err
	}
	inc.Previous, t.rep.FullReason = prev, why
	return inc, id, nil
}

// recordValues records the rows' values of the discrepancies found, as both sides had them at
// the comparison.
func (v *verifyRun) recordValues(ctx context.Context, stx, ttx pgx.Tx, t *verifyTable, found []coverage.Discrepancy) error {
	for from := 0; from < len(found); from += 1000 {
		part := found[from:min(len(found), from+1000)]
		keys := make([][]string, len(part))
		for i, d := range part {
			keys[i] = d.Key
		}
		srcVals, err := reconcile.Lookup(ctx, stx, reconcile.Source, t.Table, keys, reconcile.LookupOpts{})
		if err != nil {
			return err
		}
		tgtVals, err := reconcile.Lookup(ctx, ttx, reconcile.Target, t.Table, keys, reconcile.LookupOpts{Live: true})
		if err != nil {
			return err
		}
		for i, d := range part {
			if err := coverage.SetDiscrepancyValues(ctx, v.led, d.ID(), valueMap(t.Table, srcVals[i]), valueMap(t.Table, tgtVals[i])); err != nil {
				return err
			}
		}
	}
	return nil
}

// valueMap maps t's column names to vals, nil when there is no row.
func valueMap(t changebatch.Table, vals []*string) map[string]*string {
	if vals == nil {
		return nil
	}
	m := make(map[string]*string, len(vals))
	for i, c := range t.Columns {
		m[c.Name] = vals[i]
	}
	return m
}

// closeEqual closes the table's open discrepancies that this run did not find again, except those
// whose key the target had moved past S (not compared).
func (v *verifyRun) closeEqual(ctx context.Context, ttx pgx.Tx, t *verifyTable, keyCols []string) error {
	after := ""
	for {
		open, err := coverage.OpenDiscrepancies(ctx, v.led, t.TableName, keyCols, after, 1000)
		if err != nil || len(open) == 0 {
			return err
		}
		after = open[len(open)-1].ID
		var stale []coverage.OpenDiscrepancy
		for _, d := range open {
			if d.LastRun != v.runID {
				stale = append(stale, d)
			}
		}
		keys := make([][]string, len(stale))
		for i, d := range stale {
			keys[i] = d.Key
		}
		moved := make([][]*string, len(stale))
		if !t.Keyless { // a keyless table's values are compared at S whatever moved since
			if moved, err = reconcile.Lookup(ctx, ttx, reconcile.Target, t.Table, keys, reconcile.LookupOpts{NewerThan: v.snap.LSN.String()}); err != nil {
				return err
			}
		}
		var ids []string
		for i, d := range stale {
			if moved[i] == nil {
				ids = append(ids, d.ID)
			}
		}
		if len(ids) == 0 {
			continue
		}
		n, err := coverage.CloseDiscrepancies(ctx, v.led, ids, coverage.RemediationEqual, 0)
		if err != nil {
			return err
		}
		t.rep.ClosedEqual += n
	}
}

// discrepancyKeyColumns returns the key columns t's discrepancies are recorded under: its key's,
// or for a keyless table reconcile.KeylessKeyColumn.
func discrepancyKeyColumns(t changebatch.Table) []string {
	if t.Keyless {
		return []string{reconcile.KeylessKeyColumn}
	}
	return backfill.KeyColumnNames(t)
}
