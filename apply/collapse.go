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
}

// collapse reduces rows [from, to) of v (none of them OpTruncate) to one row per key: the newest
// version wins; a column the newest left unchanged (unchanged TOAST) takes the value of the older
// change of that key, when that one is an upsert that carried it. Rows keep the order in which
// their keys first appeared. It returns the rows and how many changes were merged away.
func collapse(v *changebatch.View, from, to int) (rows []stagedRow, merged int) {
	keys := v.Table.KeyIndexes()
	index := make(map[string]int, to-from)
	var kb strings.Builder
	for i := from; i < to; i++ {
		c := v.Change(i)
		k := keyOf(&kb, c.Values, keys)
		j, seen := index[k]
		if !seen {
			index[k] = len(rows)
			rows = append(rows, stagedRow{op: c.Op, version: c.Version, values: c.Values})
			continue
		}
		merged++
		older, newer := rows[j], stagedRow{op: c.Op, version: c.Version, values: c.Values}
		if newer.version.Compare(older.version) < 0 {
			older, newer = newer, older
		}
		rows[j] = mergeRows(older, newer)
	}
	return rows, merged
}

// mergeRows returns newer with its unchanged columns filled from older where older knows them.
func mergeRows(older, newer stagedRow) stagedRow {
	if newer.op != changebatch.OpUpsert || older.op != changebatch.OpUpsert {
		return newer
	}
	out := newer
	out.values = append([]changebatch.Value(nil), newer.values...)
	for i, val := range out.values {
		if val.Unchanged && !older.values[i].Unchanged {
			out.values[i] = older.values[i]
		}
	}
	return out
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
