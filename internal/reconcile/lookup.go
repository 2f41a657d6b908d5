package reconcile

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/backfill"
)

// Side names which database a lookup reads.
type Side int

// The two sides of a comparison.
const (
	Source Side = iota
	Target
)

// LookupOpts narrows a Lookup on the target: Live keeps live rows only; NewerThan, when non-zero,
// keeps rows at a version above (NewerThan, 0) only.
type LookupOpts struct {
	Live      bool
	NewerThan string // an LSN as text, "" for none
}

// Lookup reads the rows of table t with the given keys (each key's values as text, in
// t.KeyOrder) through q, matched by the key types' own equality, and returns each key's column
// values as text (nil for NULL), in t.Columns order, or nil when there is no such row. On the
// source it reads the table as a snapshot read does (with a partitioned table's partitions).
func Lookup(ctx context.Context, q Querier, side Side, t changebatch.Table, keys [][]string, opts LookupOpts) ([][]*string, error) {
	out := make([][]*string, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	join, args, err := backfill.KeyJoin(t, keys)
	if err != nil {
		return nil, fmt.Errorf("look up keys of %s: %w", t, err)
	}
	var cond []string
	sel := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		sel[i] = "s." + pgx.Identifier{c.Name}.Sanitize() + "::text"
	}
	rel := t.SourceRelation("s")
	if side == Target {
		rel = t.Quoted() + " as s"
		if opts.Live {
			cond = append(cond, ` and not s."_cdc_deleted"`)
		}
		if opts.NewerThan != "" {
			args = append(args, opts.NewerThan)
			cond = append(cond, ` and (s."_cdc_lsn", s."_cdc_seq") > ($`+strconv.Itoa(len(args))+`::pg_lsn, 0)`)
		}
	}
	sql := "select u.ord, array[" + strings.Join(sel, ", ") + "]::text[] from " + rel + " " + join + strings.Join(cond, "")
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("look up keys of %s: %w", t, err)
	}
	for rows.Next() {
		var ord int64
		var vals []*string
		if err := rows.Scan(&ord, &vals); err != nil {
			rows.Close()
			return nil, fmt.Errorf("look up keys of %s: %w", t, err)
		}
		if ord < 1 || int(ord) > len(keys) {
			rows.Close()
			return nil, fmt.Errorf("look up keys of %s: ordinal %d out of range", t, ord)
		}
		out[ord-1] = vals
	}
	rows.Close()
	err = rows.Err()
	if err != nil {
		return nil, fmt.Errorf("look up keys of %s: %w", t, err)
	}
	return out, nil
}
