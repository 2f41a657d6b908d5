package cdc

import (
	"fmt"
	"slices"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// relation maps one pgoutput Relation to a replicated table: cols[i] is the table column of the
// relation's column i. A nil builder means the table is not replicated and its changes are skipped.
type relation struct {
	table   changebatch.Table
	cols    []int
	builder *changebatch.Builder
	// superseded marks a relation that differs from the description below the table's reload
	// fence: its changes are suppressed by the reload's fence anyway, so one that lacks the
	// description's key (sent under another replica identity) is passed over.
	superseded bool
}

// assembler turns decoded pgoutput messages into per-table change batches. It accumulates whole
// transactions (a group) until the stream takes them; the open transaction's changes may be taken
// too when it grows past the memory bound, and then end stays at the last whole transaction.
type assembler struct {
	mem      memory.Allocator
	byOID    map[uint32]changebatch.Table // replicated tables by source oid
	tables   map[string]changebatch.Table // replicated tables without an oid, by quoted name
	rels     map[uint32]*relation
	builders map[string]*changebatch.Builder
	order    []string // builder keys in order of first use
	// describedAt is the source position read before the tables were described
	// (StreamConfig.DescribedAt).
	describedAt pglogrepl.LSN
	// fences are the tables' reload fences by source oid (StreamConfig.ReloadFences).
	fences map[uint32]pglogrepl.LSN

	inTxn     bool
	finalLSN  pglogrepl.LSN // commit LSN of the open transaction (Begin.FinalLSN)
	seq       uint64        // ordinal of the last change of the open transaction
	txns      int           // whole transactions in the group
	end       pglogrepl.LSN // end LSN of the last whole transaction in the group
	committed int64         // whole transactions seen, ever
	changes   int64         // row changes appended, ever
	// toastInserts counts, per table (quoted name), the INSERTs of the group that left a TOASTed
	// value out as unchanged, and the first one's commit LSN (takeToastInserts).
	toastInserts map[string]toastInsert
}

// toastInsert is what the assembler saw of INSERTs without some of their values: PostgreSQL 15
// sends an UPDATE that moves a row into a publication's row filter as an INSERT, and keeps the
// "unchanged TOAST" marker of the values it did not detoast, so the target cannot know them.
type toastInsert struct {
	Rows  int64
	First pglogrepl.LSN
}

func newAssembler(mem memory.Allocator, tables []changebatch.Table, describedAt pglogrepl.LSN, fences map[uint32]pglogrepl.LSN) *assembler {
	a := &assembler{mem: mem, describedAt: describedAt, fences: fences, tables: map[string]changebatch.Table{}, byOID: map[uint32]changebatch.Table{},
		rels: map[uint32]*relation{}, builders: map[string]*changebatch.Builder{}}
	for _, t := range tables {
		if t.SourceOID != 0 {
			a.byOID[t.SourceOID] = t
		} else {
			a.tables[t.String()] = t
		}
	}
	return a
}

// pending returns the rows and approximate bytes held for the next group.
func (a *assembler) pending() (rows, bytes int) {
	for _, b := range a.builders {
		rows += b.Rows()
		bytes += b.Bytes()
	}
	return rows, bytes
}

// handle applies one decoded message. It returns true when the message completed a transaction.
func (a *assembler) handle(m pglogrepl.Message) (bool, error) {
	switch m := m.(type) {
	case *pglogrepl.BeginMessage:
		if a.inTxn {
			return false, fmt.Errorf("pgoutput: Begin of transaction %d at %s inside transaction at %s", m.Xid, m.FinalLSN, a.finalLSN)
		}
		a.inTxn, a.finalLSN, a.seq = true, m.FinalLSN, 0
	case *pglogrepl.CommitMessage:
		if !a.inTxn || m.CommitLSN != a.finalLSN {
			return false, fmt.Errorf("pgoutput: Commit at %s does not match the open transaction (Begin final LSN %s)", m.CommitLSN, a.finalLSN)
		}
		a.inTxn = false
		a.txns++
		a.committed++
		a.end = m.TransactionEndLSN
		return true, nil
	case *pglogrepl.RelationMessage:
		return false, a.relation(m)
	case *pglogrepl.InsertMessage:
		return false, a.insert(m)
	case *pglogrepl.UpdateMessage:
		return false, a.update(m)
	case *pglogrepl.DeleteMessage:
		return false, a.delete(m)
	case *pglogrepl.TruncateMessage:
		return false, a.truncate(m)
	}
	// Type, Origin and logical decoding messages carry nothing to apply.
	return false, nil
}

// relation records how the relation's columns map onto the replicated table, found by the
// relation's oid (by its name for a table described without one): a table renamed or moved to
// another schema is still the same table, and a new table that took its name is not.
//
// A Relation message that differs from the table's description (compareRelation) is handled by
// the transaction's commit LSN L:
//   - L below the table's reload fence (StreamConfig.ReloadFences): a backfill read after L is
//     due and overwrites what this transaction wrote, so its columns that the description lacks,
//     or types otherwise, are not written, and those it lacks stay unknown;
//   - L at or after describedAt: a schema change the description has not seen (SchemaChangeError);
//   - L before describedAt, and the message only has columns dropped since: their values are not
//     written (the target keeps such columns, unwritten);
//   - otherwise the transaction's values cannot all be written: SchemaChangeError with Reload set.
func (a *assembler) relation(m *pglogrepl.RelationMessage) error {
	t, ok := a.described(m)
	name := t.TableName
	if !ok {
		a.rels[m.RelationID] = &relation{}
		return nil
	}
	superseded := false
	if ch := compareRelation(t, m, a.finalLSN); ch != nil {
		switch {
		case a.finalLSN < a.fences[t.SourceOID]:
			superseded = true
		case a.finalLSN >= a.describedAt:
			ch.Reload = ch.Reload || ch.KeyChanged
			return ch
		case len(ch.Dropped) == 0 && len(ch.Retyped) == 0 && !ch.KeyChanged:
		default:
			ch.Reload = true
			return ch
		}
	}
	r := &relation{table: t, cols: make([]int, len(m.Columns)), superseded: superseded}
	for i, c := range m.Columns {
		j := t.ColumnIndex(c.Name)
		if j >= 0 && t.Columns[j].TypeOID != 0 && (t.Columns[j].TypeOID != c.DataType || t.Columns[j].TypeMod != c.TypeModifier) {
			j = -1
		}
		r.cols[i] = j
	}
	b, ok := a.builders[name.String()]
	if !ok {
		b = changebatch.NewBuilder(a.mem, t)
		a.builders[name.String()] = b
		a.order = append(a.order, name.String())
	}
	r.builder = b
	a.rels[m.RelationID] = r
	return nil
}

func (a *assembler) rel(id uint32) (*relation, error) {
	r, ok := a.rels[id]
	if !ok {
		return nil, fmt.Errorf("pgoutput: change for relation %d before its Relation message", id)
	}
	if !a.inTxn {
		return nil, fmt.Errorf("pgoutput: change for relation %d outside a transaction", id)
	}
	a.seq++
	return r, nil
}

// values converts a tuple into values aligned with the table's columns. Columns the relation does
// not carry are marked unchanged (unknown), never NULL.
func (r *relation) values(tup *pglogrepl.TupleData) ([]changebatch.Value, error) {
	vals := make([]changebatch.Value, len(r.table.Columns))
	for i := range vals {
		vals[i].Unchanged = true
	}
	if tup == nil || len(tup.Columns) != len(r.cols) {
		return nil, fmt.Errorf("pgoutput: tuple of %s has the wrong number of columns", r.table)
	}
	for i, c := range tup.Columns {
		if r.cols[i] < 0 {
			continue // a column of older history that the description supersedes
		}
		v := &vals[r.cols[i]]
		switch c.DataType {
		case pglogrepl.TupleDataTypeNull:
			*v = changebatch.Value{Null: true}
		case pglogrepl.TupleDataTypeToast:
			*v = changebatch.Value{Unchanged: true}
		case pglogrepl.TupleDataTypeText:
			*v = changebatch.Value{Text: string(c.Data)}
		default:
			return nil, fmt.Errorf("pgoutput: column %q of %s has tuple data type %q; pgconverge requests text values", r.table.Columns[r.cols[i]].Name, r.table, c.DataType)
		}
	}
	return vals, nil
}

func (a *assembler) version() changebatch.Version {
	return changebatch.Version{LSN: a.finalLSN, Seq: a.seq}
}

func (a *assembler) add(r *relation, c changebatch.Change) {
	r.builder.Append(c)
	a.changes++
}

func (a *assembler) insert(m *pglogrepl.InsertMessage) error {
	r, err := a.rel(m.RelationID)
	if err != nil || r.builder == nil {
		return err
	}
	vals, err := r.values(m.Tuple)
	if err != nil {
		return err
	}
	if r.table.Keyless && r.superseded {
		return nil // a reload's snapshot replaces what it would write
	}
	ver := a.version()
	if slices.ContainsFunc(m.Tuple.Columns, func(c *pglogrepl.TupleDataColumn) bool { return c.DataType == pglogrepl.TupleDataTypeToast }) {
		if r.table.Keyless {
			return fmt.Errorf("pgoutput: insert into keyless table %s at %s left a TOASTed value out, so the row's value is not known", r.table, a.finalLSN)
		}
		if a.toastInserts == nil {
			a.toastInserts = map[string]toastInsert{}
		}
		ti, ok := a.toastInserts[r.table.String()]
		if !ok {
			ti.First = ver.LSN
		}
		ti.Rows++
		a.toastInserts[r.table.String()] = ti
	}
	a.add(r, changebatch.Change{Op: changebatch.OpUpsert, Version: ver, Values: vals})
	return nil
}

// takeToastInserts returns the INSERTs without some values seen since the last call, by table.
func (a *assembler) takeToastInserts() map[string]toastInsert {
	ti := a.toastInserts
	a.toastInserts = nil
	return ti
}

// update emits the new row image; when the key changed (the old key is sent), it first emits a
// tombstone for the old key at the same version.
func (a *assembler) update(m *pglogrepl.UpdateMessage) error {
	r, err := a.rel(m.RelationID)
	if err != nil || r.builder == nil {
		return err
	}
	vals, err := r.values(m.NewTuple)
	if err != nil {
		return err
	}
	var old []changebatch.Value
	if m.OldTuple != nil {
		if old, err = r.values(m.OldTuple); err != nil {
			return err
		}
		if r.table.Keyless {
			if r.superseded {
				return nil // a reload's snapshot replaces what it would write
			}
			return a.updateKeyless(r, old, vals)
		}
		if r.superseded && !hasKey(r.table, old) {
			// The old key tuple of another replica identity: the description's old key is not
			// known, and the reload's fence refuses this change anyway.
			old = nil
		}
	}
	if r.table.Keyless {
		if r.superseded {
			return nil
		}
		return fmt.Errorf("pgoutput: update of keyless table %s at %s did not send the old row; its REPLICA IDENTITY is no longer FULL: run ALTER TABLE %s REPLICA IDENTITY FULL on the source", r.table, a.finalLSN, r.table.Quoted())
	}
	keyChanged := false
	for _, k := range r.table.KeyIndexes() {
		if vals[k].Unchanged {
			if r.superseded && (old == nil || old[k].Unchanged) {
				return nil
			}
			if old == nil || old[k].Unchanged {
				return fmt.Errorf("pgoutput: update of %s at %s did not send key column %q", r.table, a.finalLSN, r.table.Columns[k].Name)
			}
			vals[k] = old[k]
		}
		if old != nil && !old[k].Unchanged && (old[k].Null != vals[k].Null || old[k].Text != vals[k].Text) {
			keyChanged = true
		}
	}
	if keyChanged {
		a.add(r, changebatch.Change{Op: changebatch.OpDelete, Version: a.version(), Values: keyOnly(r.table, old)})
	}
	a.add(r, changebatch.Change{Op: changebatch.OpUpsert, Version: a.version(), Values: vals})
	return nil
}

func (a *assembler) delete(m *pglogrepl.DeleteMessage) error {
	r, err := a.rel(m.RelationID)
	if err != nil || r.builder == nil {
		return err
	}
	old, err := r.values(m.OldTuple)
	if err != nil {
		return err
	}
	if r.table.Keyless {
		if r.superseded {
			return nil // a reload's snapshot replaces what it would write
		}
		if m.OldTupleType != pglogrepl.UpdateMessageTupleTypeOld || slices.ContainsFunc(old, func(v changebatch.Value) bool { return v.Unchanged }) {
			return fmt.Errorf("pgoutput: delete from keyless table %s at %s did not send the whole old row; its REPLICA IDENTITY is no longer FULL: run ALTER TABLE %s REPLICA IDENTITY FULL on the source", r.table, a.finalLSN, r.table.Quoted())
		}
		a.add(r, changebatch.Change{Op: changebatch.OpDelete, Version: a.version(), Values: old})
		return nil
	}
	for _, k := range r.table.KeyIndexes() {
		if (old[k].Unchanged || old[k].Null) && r.superseded {
			return nil
		}
		if old[k].Unchanged || old[k].Null {
			return fmt.Errorf("pgoutput: delete from %s at %s did not send key column %q; if its replica identity changed since, the next catalog check (within 5 s) reloads the table under the new key",
				r.table, a.finalLSN, r.table.Columns[k].Name)
		}
	}
	a.add(r, changebatch.Change{Op: changebatch.OpDelete, Version: a.version(), Values: keyOnly(r.table, old)})
	return nil
}

// updateKeyless emits an UPDATE of a keyless table as what it does to the multiset of row values:
// one occurrence of the old value deleted, one of the new value inserted, both at the change's
// version. Unchanged TOASTed values of the new row are the old row's (REPLICA IDENTITY FULL sends
// the old row whole). An UPDATE that leaves the value as it was changes nothing and is not emitted.
func (a *assembler) updateKeyless(r *relation, old, vals []changebatch.Value) error {
	same := true
	for i := range vals {
		if vals[i].Unchanged {
			vals[i] = old[i]
		}
		if old[i].Unchanged {
			return fmt.Errorf("pgoutput: update of keyless table %s at %s sent an old row without column %q", r.table, a.finalLSN, r.table.Columns[i].Name)
		}
		same = same && vals[i] == old[i]
	}
	if same {
		return nil
	}
	a.add(r, changebatch.Change{Op: changebatch.OpDelete, Version: a.version(), Values: old})
	a.add(r, changebatch.Change{Op: changebatch.OpUpsert, Version: a.version(), Values: vals})
	return nil
}

func (a *assembler) truncate(m *pglogrepl.TruncateMessage) error {
	if !a.inTxn {
		return fmt.Errorf("pgoutput: Truncate outside a transaction")
	}
	a.seq++
	for _, id := range m.RelationIDs {
		r, ok := a.rels[id]
		if !ok {
			return fmt.Errorf("pgoutput: Truncate of relation %d before its Relation message", id)
		}
		if r.builder == nil {
			continue
		}
		vals := make([]changebatch.Value, len(r.table.Columns))
		for i := range vals {
			vals[i].Null = true
		}
		a.add(r, changebatch.Change{Op: changebatch.OpTruncate, Version: a.version(), Values: vals})
	}
	return nil
}

// hasKey reports whether vals carry a value for every key column of t.
func hasKey(t changebatch.Table, vals []changebatch.Value) bool {
	for _, k := range t.KeyIndexes() {
		if vals[k].Unchanged || vals[k].Null {
			return false
		}
	}
	return true
}

// keyOnly keeps the key columns of vals and makes the rest NULL, the shape of a tombstone.
func keyOnly(t changebatch.Table, vals []changebatch.Value) []changebatch.Value {
	out := make([]changebatch.Value, len(vals))
	for i, c := range t.Columns {
		if c.Key {
			out[i] = vals[i]
		} else {
			out[i] = changebatch.Value{Null: true}
		}
	}
	return out
}

// take returns the held changes as batches, one per table with changes, and the end LSN of the
// last whole transaction among them (0 when none is whole). The caller owns and releases the
// batches.
func (a *assembler) take() ([]arrow.RecordBatch, pglogrepl.LSN) {
	var out []arrow.RecordBatch
	for _, k := range a.order {
		if b := a.builders[k]; b.Rows() > 0 {
			out = append(out, b.NewBatch())
		}
	}
	end := a.end
	if a.txns == 0 {
		end = 0
	}
	a.txns, a.end = 0, 0
	return out, end
}

// release frees the builders.
func (a *assembler) release() {
	for _, b := range a.builders {
		b.Release()
	}
}
