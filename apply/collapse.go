package apply

import (
	"strconv"
	"strings"

	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// stagedRow is one row as it is staged: the newest change of its key within a segment of a batch.
type stagedRow struct {
	op      changebatch.Op
	version changebatch.Version
	values  []changebatch.Value
	// moved marks an upsert of a key an update moved there from another key: its unchanged
	// (unknown) columns belong to the old key's row, never to an earlier row of the new key.
	moved bool
	// movedAt is the version of the key change that brought the row's value to its key.
	movedAt changebatch.Version
	// from lists the keys the row's value moved through, oldest first, whose target rows may still
	// hold the unchanged columns of a moved row; nil when there is nothing to look up.
	from []moveSource
}

// moveSource is a key a moved row's value passed through: the value can only be in that key's
// target row at a version in [arrived, left): from the key change that brought it there (zero for
// the first key of a chain, where the value was before the batch) to the one that moved it away.
// Outside that range the key holds another row: an earlier one before the value arrived, a later
// one after it left.
type moveSource struct {
	key           []changebatch.Value // key columns set
	arrived, left changebatch.Version
}

// collapse reduces rows [from, to) of v (none of them OpTruncate) to one row per key: the newest
// version wins; a column the newest left unchanged (unchanged TOAST) takes the value of the older
// change of that key, when that one is an upsert that carried it. A key change is a tombstone of
// the old key directly followed by an upsert of the new key with the same version
// (changebatch); the upsert's unchanged columns are taken from the old key's state. Rows keep the
// order in which their keys first appeared. It returns the rows and how many changes were merged
// away.
func collapse(v *changebatch.View, from, to int) (rows []stagedRow, merged int) {
	keys := v.Table.KeyIndexes()
	index := make(map[string]int, to-from)
	var kb strings.Builder
	var oldRow *stagedRow          // state of a moved row's old key just before its tombstone
	var oldKey []changebatch.Value // the old key of the move in progress
	for i := from; i < to; i++ {
		c := v.Change(i)
		k := keyOf(&kb, c.Values, keys)
		r := stagedRow{op: c.Op, version: c.Version, values: c.Values}
		if c.Op == changebatch.OpDelete && i+1 < to && isMove(v, i+1) {
			oldRow, oldKey = nil, c.Values
			if j, ok := index[k]; ok {
				cp := rows[j]
				oldRow = &cp
			}
		}
		if i > from && isMove(v, i) {
			r = resolveMove(r, oldRow, oldKey)
		}
		j, seen := index[k]
		if !seen {
			index[k] = len(rows)
			rows = append(rows, r)
			continue
		}
		merged++
		older, newer := rows[j], r
		if newer.version.Compare(older.version) < 0 {
			older, newer = newer, older
		}
		rows[j] = mergeRows(older, newer)
	}
	return rows, merged
}

// isMove reports whether row i is the upsert half of a key change: an upsert directly after a
// delete with the same version.
func isMove(v *changebatch.View, i int) bool {
	return i > 0 && v.Op(i) == changebatch.OpUpsert && v.Op(i-1) == changebatch.OpDelete &&
		v.Version(i).Compare(v.Version(i-1)) == 0
}

// resolveMove fills the unchanged columns of moved row r from old, the old key's state in the
// batch (nil when the batch did not touch it). What old does not know comes from the target: from
// the row of oldKey or, when old was itself moved there in this batch (a chain of key changes, as
// in a swap of keys), from the row of any key of the chain. Which of them holds the value depends
// on how much of the chain an earlier, interrupted apply of a split transaction already wrote, so
// all of them are candidates (lookupMoved takes the newest live one).
func resolveMove(r stagedRow, old *stagedRow, oldKey []changebatch.Value) stagedRow {
	r.moved, r.movedAt = true, r.version
	if !anyUnchanged(r.values) {
		return r
	}
	src := moveSource{key: oldKey, left: r.version}
	if old == nil {
		r.from = []moveSource{src}
		return r
	}
	if old.op != changebatch.OpUpsert {
		return r
	}
	r.values = fillUnchanged(r.values, old.values)
	if !anyUnchanged(r.values) {
		return r
	}
	if old.moved {
		src.arrived = old.movedAt
		r.from = append(append([]moveSource(nil), old.from...), src)
	} else {
		r.from = []moveSource{src}
	}
	return r
}

// mergeRows returns newer with its unchanged columns filled from older where older knows them;
// columns both left unchanged stay unknown and come from where older's would have come from.
func mergeRows(older, newer stagedRow) stagedRow {
	if newer.op != changebatch.OpUpsert || older.op != changebatch.OpUpsert || newer.moved {
		return newer
	}
	out := newer
	out.values = fillUnchanged(newer.values, older.values)
	if anyUnchanged(out.values) {
		out.moved, out.from, out.movedAt = older.moved, older.from, older.movedAt
	}
	return out
}

// fillUnchanged returns vals with each unchanged value replaced by the known value in known.
func fillUnchanged(vals, known []changebatch.Value) []changebatch.Value {
	out := append([]changebatch.Value(nil), vals...)
	for i, val := range out {
		if val.Unchanged && !known[i].Unchanged {
			out[i] = known[i]
		}
	}
	return out
}

func anyUnchanged(vals []changebatch.Value) bool {
	for _, v := range vals {
		if v.Unchanged {
			return true
		}
	}
	return false
}

// keyOf encodes the key columns' text values unambiguously (length-prefixed).
func keyOf(b *strings.Builder, vals []changebatch.Value, keys []int) string {
	b.Reset()
	for _, k := range keys {
		b.WriteString(strconv.Itoa(len(vals[k].Text)))
		b.WriteByte(':')
		b.WriteString(vals[k].Text)
	}
	return b.String()
}
