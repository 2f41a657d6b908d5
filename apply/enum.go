package apply

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// EnumLabel is one label of a source enum: its pg_enum oid, which ALTER TYPE ... RENAME VALUE
// keeps, and its text.
type EnumLabel struct {
	OID   uint32 `json:"oid"`
	Label string `json:"label"`
}

// syncEnum brings the labels of existing target enum qualified in line with want, the source's
// labels in sort order, records want in pgconverge.enum_labels, and returns what it changed
// ("old -> new", "+added"); nothing when want is nil or the target type is not an enum.
//
// A label's oid identifies it across renames: with the labels recorded at the last sync, each
// label the source renamed is renamed alike on the target (through a temporary name, so swapped
// names work), which also changes the target rows that hold it; a label whose oid is new is
// added after the label that precedes it on the source. Without a record (an enum pgconverge did
// not create or sync), labels are matched by name: PostgreSQL cannot drop an enum label, so a
// target label the source lacks was renamed there, and it is renamed alike when it pairs with a
// source label in the same place (enumRenames); an unpaired one is an error naming the fix.
func syncEnum(ctx context.Context, conn *pgx.Conn, qualified string, want []EnumLabel) ([]string, error) {
	if want == nil {
		return nil, nil
	}
	var changed []string
	err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, `select e.enumlabel::text from pg_enum e where e.enumtypid = $1::regtype order by e.enumsortorder`, qualified)
		if err != nil {
			return err
		}
		have, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		if len(have) == 0 {
			return nil // not an enum there, or one without labels: leave it
		}
		renames, err := labelRenames(ctx, tx, qualified, have, want)
		if err != nil {
			return err
		}
		// Through temporary names first, so that names can be swapped or reused.
		rename := func(from, to string) error {
			_, err := tx.Exec(ctx, "alter type "+qualified+" rename value "+changebatch.QuoteLiteral(from)+" to "+changebatch.QuoteLiteral(to))
			if err != nil {
				return fmt.Errorf("rename label %q to %q: %w", from, to, err)
			}
			return nil
		}
		for _, r := range renames {
			if err := rename(r[0], r[2]); err != nil {
				return err
			}
		}
		for _, r := range renames {
			if err := rename(r[2], r[1]); err != nil {
				return err
			}
		}
		for _, r := range renames {
			changed = append(changed, r[0]+" -> "+r[1])
			have[slices.Index(have, r[0])] = r[1]
		}
		for i, l := range want {
			if slices.Contains(have, l.Label) {
				continue
			}
			place := " before " + changebatch.QuoteLiteral(have[0])
			if i > 0 {
				place = " after " + changebatch.QuoteLiteral(want[i-1].Label)
			}
			if _, err := tx.Exec(ctx, "alter type "+qualified+" add value "+changebatch.QuoteLiteral(l.Label)+place); err != nil {
				return fmt.Errorf("add label %q: %w", l.Label, err)
			}
			changed = append(changed, "+"+l.Label)
			have = append(have, l.Label)
		}
		return recordEnum(ctx, tx.Conn(), qualified, want)
	})
	if err != nil {
		return nil, fmt.Errorf("bring the labels of enum %s on the target in line with the source's: %w", qualified, err)
	}
	return changed, nil
}

// labelRenames returns the target labels to rename as [old, new, temporary name]: by oid against
// the labels recorded at the last sync, or by name (enumRenames) when none of want's oids was
// recorded.
func labelRenames(ctx context.Context, tx pgx.Tx, qualified string, have []string, want []EnumLabel) ([][3]string, error) {
	var raw []byte
	err := tx.QueryRow(ctx, `select labels from pgconverge.enum_labels where type_name = $1`, qualified).Scan(&raw)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, err
	}
	var rec []EnumLabel
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &rec); err != nil {
			return nil, err
		}
	}
	old := map[uint32]string{}
	for _, l := range rec {
		old[l.OID] = l.Label
	}
	var out [][3]string
	known := false
	for _, l := range want {
		was, ok := old[l.OID]
		known = known || ok
		if ok && was != l.Label && slices.Contains(have, was) {
			out = append(out, [3]string{was, l.Label, fmt.Sprintf("pgconverge renaming %d", l.OID)})
		}
	}
	if known {
		return out, nil
	}
	labels := make([]string, len(want))
	for i, l := range want {
		labels[i] = l.Label
	}
	pairs, err := enumRenames(qualified, have, labels)
	for _, p := range pairs {
		out = append(out, [3]string{p[0], p[1], "pgconverge renaming " + p[0]})
	}
	return out, err
}

// recordEnum records want as the labels of enum qualified last synced to the target.
func recordEnum(ctx context.Context, conn *pgx.Conn, qualified string, want []EnumLabel) error {
	raw, err := json.Marshal(want)
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, `insert into pgconverge.enum_labels (type_name, labels) values ($1, $2)
on conflict (type_name) do update set labels = excluded.labels`, qualified, raw)
	if err != nil {
		return fmt.Errorf("record the labels of enum %s: %w", qualified, err)
	}
	return nil
}

// enumRenames pairs each label of have (the target's, in order) that want (the source's) lacks
// with the label want has in its place: between the same labels both have, in order. It returns
// an error naming the fix when the counts in a place differ.
func enumRenames(qualified string, have, want []string) ([][2]string, error) {
	var out [][2]string
	for i := 0; i < len(have); {
		if slices.Contains(want, have[i]) {
			i++
			continue
		}
		// have[i:j] lack on the source; they sit between have[i-1] and have[j] (common or ends).
		j := i
		for j < len(have) && !slices.Contains(want, have[j]) {
			j++
		}
		lo, hi := 0, len(want)
		if i > 0 {
			lo = slices.Index(want, have[i-1]) + 1
		}
		if j < len(have) {
			hi = slices.Index(want, have[j])
		}
		var cands []string
		for _, l := range want[lo:max(lo, hi)] {
			if !slices.Contains(have, l) {
				cands = append(cands, l)
			}
		}
		if len(cands) != j-i {
			return nil, fmt.Errorf("enum %s has labels %q on the target that the source lacks (renamed there?) and cannot be paired with the source's labels %q: rename them on the target (ALTER TYPE %s RENAME VALUE ...) as on the source and restart",
				qualified, have[i:j], cands, qualified)
		}
		for k := range cands {
			out = append(out, [2]string{have[i+k], cands[k]})
		}
		i = j
	}
	return out, nil
}
