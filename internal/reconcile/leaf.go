package reconcile

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/backfill"
	"golang.org/x/sync/errgroup"
)

// leafRow is one row of a leaf fetch: its key hash, row hash and key, and on the target its
// version and whether it is a tombstone.
type leafRow struct {
	hk, h   int64
	key     []string
	version changebatch.Version
	deleted bool
}

// compareRows orders rows as both sides' leaf queries return them: by key hash, then by the key's
// texts in byte order (COLLATE "C").
func compareRows(a, b *leafRow) int {
	if c := cmp.Compare(a.hk, b.hk); c != 0 {
		return c
	}
	return slices.Compare(a.key, b.key)
}

// emitBatch is how many differences are handed to Config.Emit at once.
const emitBatch = 1000

// leaf fetches the rows of l's groups from both sides, each ordered by key hash and key, and
// merges the two streams: memory stays bounded however many rows the groups hold.
func (c *comparison) leaf(ctx context.Context, l levelState) error {
	keys := keyTexts(c.cfg.Table)
	order := make([]string, len(keys))
	for i := range keys {
		keys[i] += " collate \"C\" as k" + strconv.Itoa(i)
		order[i] = "k" + strconv.Itoa(i)
	}
	orderBy := " order by hk, " + strings.Join(order, ", ")
	srcSQL := "select hk, h, " + strings.Join(order, ", ") + " from (select " + c.keyH + " as hk, " + c.rowH + " as h, " +
		strings.Join(keys, ", ") + " from " + c.cfg.Table.SourceRelation("t") + ") s where " + l.filter() + orderBy
	tgtSQL := "select hk, h, " + strings.Join(order, ", ") + ", lsn, seq, deleted from (select " + c.keyH + " as hk, " + c.rowH + " as h, " +
		strings.Join(keys, ", ") + `, "_cdc_lsn"::text as lsn, "_cdc_seq" as seq, "_cdc_deleted" as deleted from ` + c.cfg.Table.Quoted() + ") s where " + l.filter() + orderBy
	g, gctx := errgroup.WithContext(ctx)
	srcRows, tgtRows := make(chan *leafRow, 256), make(chan *leafRow, 256)
	g.Go(func() error { return c.stream(gctx, c.src, srcSQL, false, srcRows) })
	g.Go(func() error { return c.stream(gctx, c.tgt, tgtSQL, true, tgtRows) })
	g.Go(func() error { return c.merge(gctx, srcRows, tgtRows) })
	if err := g.Wait(); err != nil {
		return fmt.Errorf("compare the rows of %s: %w", c.cfg.Table, err)
	}
	return nil
}

// stream sends the rows of sql to out in order and closes it.
func (c *comparison) stream(ctx context.Context, q Querier, sql string, target bool, out chan<- *leafRow) error {
	defer close(out)
	rows, err := q.Query(ctx, sql)
	if err != nil {
		return err
	}
	defer rows.Close()
	n := len(c.cfg.Table.KeyOrder())
	for rows.Next() {
		raw := rows.RawValues()
		var bytes int64
		for _, r := range raw {
			bytes += int64(len(r))
		}
		c.count(1, bytes)
		vals, err := rows.Values()
		if err != nil {
			return err
		}
		r := &leafRow{hk: vals[0].(int64), h: vals[1].(int64), key: make([]string, n)}
		for i := range n {
			r.key[i] = vals[2+i].(string)
		}
		if target {
			lsn, err := pglogrepl.ParseLSN(vals[2+n].(string))
			if err != nil {
				return err
			}
			r.version = changebatch.Version{LSN: lsn, Seq: uint64(vals[3+n].(int64))}
			r.deleted = vals[4+n].(bool)
		}
		select {
		case out <- r:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return rows.Err()
}

// merge walks both ordered streams and classifies each key.
func (c *comparison) merge(ctx context.Context, src, tgt <-chan *leafRow) error {
	s, t := <-src, <-tgt
	var diffs []Diff
	snap := changebatch.Version{LSN: c.cfg.Snapshot}
	for s != nil || t != nil {
		var d *Diff
		switch order := cmpNil(s, t); {
		case order < 0: // only the source has the key
			d = &Diff{Kind: Missing, Key: s.key, SourceHash: hashHex(s.h)}
			s = <-src
		case order > 0: // only the target has the key
			if t.version.Compare(snap) <= 0 && !t.deleted {
				d = &Diff{Kind: Extra, Key: t.key, TargetHash: hashHex(t.h), TargetVersion: t.version}
			}
			t = <-tgt
		default:
			switch {
			case t.version.Compare(snap) > 0: // moved past S: not compared
			case t.deleted:
				d = &Diff{Kind: Missing, Key: s.key, SourceHash: hashHex(s.h), TargetVersion: t.version, TargetDeleted: true}
			case s.h != t.h:
				d = &Diff{Kind: Different, Key: s.key, SourceHash: hashHex(s.h), TargetHash: hashHex(t.h), TargetVersion: t.version}
			}
			s, t = <-src, <-tgt
		}
		if d == nil {
			continue
		}
		c.stats.Found[d.Kind]++
		diffs = append(diffs, *d)
		if len(diffs) >= emitBatch {
			if err := c.emit(ctx, diffs); err != nil {
				return err
			}
			diffs = diffs[:0]
		}
	}
	if len(diffs) > 0 {
		return c.emit(ctx, diffs)
	}
	return ctx.Err()
}

func (c *comparison) emit(ctx context.Context, diffs []Diff) error {
	if c.cfg.Emit == nil {
		return nil
	}
	return c.cfg.Emit(ctx, diffs)
}

// cmpNil orders a and b, a nil row (its stream ended) after every other.
func cmpNil(a, b *leafRow) int {
	switch {
	case a == nil:
		return 1
	case b == nil:
		return -1
	}
	return compareRows(a, b)
}

// hashHex prints a row hash as 16 hex digits.
func hashHex(h int64) string { return fmt.Sprintf("%016x", uint64(h)) }

// movedBatch is how many moved keys one source lookup takes.
const movedBatch = 5000

// loadMoved reads the keys of the target rows newer than (S, 0) and, from the source, the hashes
// of the rows those keys have at S, which the source's checksums then leave out.
func (c *comparison) loadMoved(ctx context.Context) error {
	t := c.cfg.Table
	keys := keyTexts(t)
	rows, err := c.tgt.Query(ctx, "select "+strings.Join(keys, ", ")+" from "+t.Quoted()+
		` where ("_cdc_lsn", "_cdc_seq") > ($1::pg_lsn, 0)`, c.cfg.Snapshot.String())
	if err != nil {
		return fmt.Errorf("read the keys of %s the target has past the snapshot: %w", t, err)
	}
	var moved [][]string
	for rows.Next() {
		var bytes int64
		key := make([]string, len(keys))
		for i, r := range rows.RawValues() {
			key[i] = string(r)
			bytes += int64(len(r))
		}
		c.count(1, bytes)
		moved = append(moved, key)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read the keys of %s the target has past the snapshot: %w", t, err)
	}
	for from := 0; from < len(moved); from += movedBatch {
		if err := c.lookupMoved(ctx, moved[from:min(len(moved), from+movedBatch)]); err != nil {
			return fmt.Errorf("read the source rows of keys of %s the target has past the snapshot: %w", t, err)
		}
	}
	return nil
}

// lookupMoved reads the key and row hashes of the source rows with the given keys (each key's
// values as text, in KeyOrder), matched by the key types' own equality.
func (c *comparison) lookupMoved(ctx context.Context, keys [][]string) error {
	t := c.cfg.Table
	join, args, err := backfill.KeyJoin(t, keys)
	if err != nil {
		return err
	}
	rows, err := c.src.Query(ctx, "select "+keyHash(c.cfg.Mode, t, "s.")+", "+rowHash(c.cfg.Mode, t, "s.")+" from "+c.cfg.Table.SourceRelation("s")+" "+join, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var p pair
		if err := rows.Scan(&p.key, &p.row); err != nil {
			return err
		}
		c.count(1, 16)
		c.moved = append(c.moved, p)
	}
	return rows.Err()
}
