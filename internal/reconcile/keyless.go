package reconcile

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/pgconverge/pgconverge/apply/changebatch"
	"golang.org/x/sync/errgroup"
)

// A keyless table (changebatch.Table.Keyless) is compared as a multiset of row values: its rows
// are grouped by the hash of their whole value (valueGroupHash) instead of a key's, so all copies
// of a value share a group and a group's checksum (rows and sum of row hashes) counts copies. At
// the leaf, each distinct value's copies are counted on both sides (leafKeyless).
//
// The target's entries show the table at S (apply's keyless rule): an entry was there at S when
// it was brought at or below (S, 0) and not deleted at or below it, whatever later changes did.
// Not so for a value that a snapshot newer than S replaced (a reload's or a repair's, or a fence
// above S) before the stream passed S: changes below that snapshot were refused, so the entries
// show the value as of an older point. Such values have moved on, as keys do (loadMovedValues).

// keylessCurrent is the target's filter for a keyless table's entries at S.
const keylessCurrent = `("_cdc_lsn", "_cdc_seq") <= ($1::pg_lsn, 0) and not ("_cdc_deleted" and ("_cdc_deleted_lsn", "_cdc_deleted_seq") <= ($1::pg_lsn, 0))`

// KeylessKeyColumn is the key column name a keyless table's discrepancies are recorded under:
// their key is the value's group hash and row hash (32 hex digits), which name the row value.
const KeylessKeyColumn = "(row value)"

// valueGroupHash is the SQL expression of the hash of a keyless table's row value that groups
// its rows: every column, with the key hash's seeds.
func valueGroupHash(mode HashMode, t changebatch.Table) string {
	idx := make([]int, len(t.Columns))
	for i := range idx {
		idx[i] = i
	}
	return combine(mode, t, idx, keySeed, "")
}

// leafKeyless counts the copies of each distinct row value in l's groups on both sides and
// emits one difference per value whose counts differ: Missing when the source has more copies,
// Extra when the target has. SourceHash and TargetHash are "<row hash>*<copies>" ("" for none).
func (c *comparison) leafKeyless(ctx context.Context, l levelState) error {
	q := func(from, where string) string {
		return "select hk, h, count(*) from (select " + c.keyH + " as hk, " + c.rowH + " as h from " + from + where + ") s where " +
			l.filter() + " group by hk, h"
	}
	var src, tgt map[[2]int64]int64
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() (err error) {
		src, err = c.counts(gctx, c.src, q(c.cfg.Table.SourceRelation("t"), ""))
		return err
	})
	g.Go(func() (err error) {
		tgt, err = c.counts(gctx, c.tgt, q(c.cfg.Table.Quoted(), " where "+c.current), c.cfg.Snapshot.String())
		return err
	})
	if err := g.Wait(); err != nil {
		return fmt.Errorf("compare the row values of %s: %w", c.cfg.Table, err)
	}
	var diffs []Diff
	add := func(v [2]int64, s, t int64) {
		if s == t {
			return
		}
		d := Diff{Kind: Missing, Key: []string{hashHex(v[0]) + hashHex(v[1])}}
		if t > s {
			d.Kind = Extra
		}
		if s > 0 {
			d.SourceHash = hashHex(v[1]) + "*" + strconv.FormatInt(s, 10)
		}
		if t > 0 {
			d.TargetHash = hashHex(v[1]) + "*" + strconv.FormatInt(t, 10)
		}
		c.stats.Found[d.Kind]++
		diffs = append(diffs, d)
	}
	for v, n := range src {
		if !c.movedValues[v] {
			add(v, n, tgt[v])
		}
	}
	for v, n := range tgt {
		if _, ok := src[v]; !ok {
			add(v, 0, n)
		}
	}
	for from := 0; from < len(diffs); from += emitBatch {
		if err := c.emit(ctx, diffs[from:min(len(diffs), from+emitBatch)]); err != nil {
			return err
		}
	}
	return nil
}

// counts reads rows (group hash, row hash, copies) of sql.
func (c *comparison) counts(ctx context.Context, q Querier, sql string, args ...any) (map[[2]int64]int64, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[[2]int64]int64{}
	for rows.Next() {
		var hk, h, n int64
		if err := rows.Scan(&hk, &h, &n); err != nil {
			return nil, err
		}
		c.count(1, 24)
		out[[2]int64{hk, h}] = n
	}
	return out, rows.Err()
}

// ValueKeySQL is the SQL expression (text) of a keyless table's row value as its discrepancies
// record it (Diff.Key): the group hash and the row hash as 32 hex digits, over the columns of t
// qualified by qual ("" or "alias."), with the hashes of mode.
func ValueKeySQL(mode HashMode, t changebatch.Table, qual string) string {
	idx := make([]int, len(t.Columns))
	for i := range idx {
		idx[i] = i
	}
	return "lpad(to_hex(" + combine(mode, t, idx, keySeed, qual) + "), 16, '0') || lpad(to_hex(" + combine(mode, t, idx, rowSeed, qual) + "), 16, '0')"
}

// loadMovedValues finds the values of a keyless table whose entries a snapshot or fence newer
// than S replaced, takes them out of the comparison on the target (c.current, and *tgtAll read
// again) and counts the source's copies of them into c.moved, which the source's checksums then
// leave out.
func (c *comparison) loadMovedValues(ctx context.Context, tgtAll *group) error {
	t := c.cfg.Table
	rows, err := c.tgt.Query(ctx, `select distinct encode("_cdc_row_hash", 'hex'), `+c.keyH+`, `+c.rowH+` from `+t.Quoted()+
		` where ("_cdc_seq" = 0 and ("_cdc_lsn", "_cdc_seq") > ($1::pg_lsn, 0))`+
		` or ("_cdc_deleted" and "_cdc_deleted_seq" = 0 and ("_cdc_deleted_lsn", "_cdc_deleted_seq") > ($1::pg_lsn, 0))`,
		c.cfg.Snapshot.String())
	if err != nil {
		return fmt.Errorf("find the values of %s replaced after the snapshot: %w", t, err)
	}
	var hashes, pairs []string
	c.movedValues = map[[2]int64]bool{}
	for rows.Next() {
		var hash string
		var hk, h int64
		if err := rows.Scan(&hash, &hk, &h); err != nil {
			rows.Close()
			return err
		}
		c.count(1, int64(len(hash))+16)
		hashes = append(hashes, hash)
		if !c.movedValues[[2]int64{hk, h}] {
			c.movedValues[[2]int64{hk, h}] = true
			pairs = append(pairs, strconv.FormatInt(hk, 10)+":"+strconv.FormatInt(h, 10))
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(hashes) == 0 {
		return err
	}
	// Hex digits and integers only: safe as literals.
	c.current += ` and encode("_cdc_row_hash", 'hex') <> all('{` + strings.Join(hashes, ",") + `}'::text[])`
	if err := c.scanOne(ctx, c.tgt, "select count(*), coalesce(sum(h), 0)::text from (select "+c.rowH+" as h from "+t.Quoted()+" where "+c.current+") s",
		tgtAll, nil, c.cfg.Snapshot.String()); err != nil {
		return err
	}
	src, err := c.counts(ctx, c.src, "select hk, h, count(*) from (select "+c.keyH+" as hk, "+c.rowH+" as h from "+t.SourceRelation("t")+
		") s where hk::text || ':' || h::text = any('{"+strings.Join(pairs, ",")+"}'::text[]) group by hk, h")
	if err != nil {
		return err
	}
	for v, n := range src {
		for range n {
			c.moved = append(c.moved, pair{key: v[0], row: v[1]})
		}
	}
	c.stats.Moved = int64(len(c.moved))
	return nil
}
