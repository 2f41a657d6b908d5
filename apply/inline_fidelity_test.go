package apply_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/pgtest"
	"github.com/pgconverge/pgconverge/migrations"
)

// oddTable returns a table named name whose columns take values that need quoting in a record
// literal, an array literal or COPY text.
func oddTable(name string) changebatch.Table {
	return changebatch.Table{TableName: changebatch.TableName{Schema: "public", Name: name}, Columns: []changebatch.Column{
		{Name: "id", Type: "integer", Key: true, KeyPos: 1},
		{Name: "t", Type: "text"},
		{Name: "arr", Type: "text[]"},
		{Name: "j", Type: "jsonb"},
		{Name: "n", Type: "numeric(6,2)"},
		{Name: "v", Type: "character varying(5)"},
		{Name: "b", Type: "bytea"},
		{Name: "r", Type: "int4range"},
		{Name: `we"ird, (col)`, Type: "text"},
	}}
}

var oddValues = []string{
	`plain`, ``, ` `, `a,b`, `(x)`, `"quoted"`, `back\slash`, `\\`, "tab\tnew\nline\rcr", `{}`, `NULL`, `\N`, `é€𝄞`, `'`, `)(,"\`,
}

// Inline merges (record literals) and COPY staging give the same rows, value for value, and both
// refuse a value that does not fit its column rather than truncating it.
func TestInlineAndCopyMergesAgree(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	ctx := context.Background()
	if err := migrations.Apply(ctx, env.Target); err != nil {
		t.Fatal(err)
	}
	inline, copied := oddTable("odd_inline"), oddTable("odd_copy")
	for _, tab := range []changebatch.Table{inline, copied} {
		if _, err := apply.EnsureTable(ctx, env.Target, tab, 0, nil); err != nil {
			t.Fatal(err)
		}
	}
	ap := apply.New(env.Target, nil)
	apply.StageByCOPY(t, ap, copied.TableName)
	text := func(s string) changebatch.Value { return changebatch.Value{Text: s} }
	null := changebatch.Value{Null: true}
	write := func(tab changebatch.Table, changes []changebatch.Change) error {
		b := changebatch.NewBuilder(memory.NewGoAllocator(), tab)
		defer b.Release()
		for _, c := range changes {
			b.Append(c)
		}
		rec := b.NewBatch()
		defer rec.Release()
		tx, err := ap.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Apply(ctx, rec); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	var changes []changebatch.Change
	for i, s := range oddValues {
		arr := `{"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `",NULL,"x y"}`
		js := fmt.Sprintf(`{"k": %q, "n": [1, 2.50]}`, s)
		changes = append(changes, changebatch.Change{Op: changebatch.OpUpsert, Version: changebatch.Version{LSN: 100, Seq: uint64(i + 1)},
			Values: []changebatch.Value{text(fmt.Sprint(i)), text(s), text(arr), text(js), text("1234.565"), text("abcde"), text(`\x00ff`), text("[1,5)"), text(s)}})
	}
	// A NULL in every column, a tombstone, and a row whose text is left unchanged (TOAST).
	changes = append(changes,
		changebatch.Change{Op: changebatch.OpUpsert, Version: changebatch.Version{LSN: 100, Seq: 100},
			Values: []changebatch.Value{text("100"), null, null, null, null, null, null, null, null}},
		changebatch.Change{Op: changebatch.OpDelete, Version: changebatch.Version{LSN: 100, Seq: 101},
			Values: []changebatch.Value{text("0"), null, null, null, null, null, null, null, null}},
		changebatch.Change{Op: changebatch.OpUpsert, Version: changebatch.Version{LSN: 200, Seq: 1},
			Values: []changebatch.Value{text("1"), {Unchanged: true}, text("{}"), text("1"), text("1"), text(""), text(`\x`), text("empty"), {Unchanged: true}}})
	for _, tab := range []changebatch.Table{inline, copied} {
		if err := write(tab, changes); err != nil {
			t.Fatalf("%s: %v", tab, err)
		}
	}
	const cols = `id, t, arr, j, n, v, b, r, "we""ird, (col)", _cdc_lsn, _cdc_seq, _cdc_deleted, _cdc_unknown`
	got := pgtest.Rows(t, env.Target, `select format('%s', row(`+cols+`)) from odd_inline order by id`)
	want := pgtest.Rows(t, env.Target, `select format('%s', row(`+cols+`)) from odd_copy order by id`)
	if d := pgtest.Diff(want, got); d != "" {
		t.Fatalf("inline rows differ from COPY's: %s", d)
	}
	if len(got) != len(oddValues)+1 {
		t.Fatalf("%d rows, want %d", len(got), len(oddValues)+1)
	}
	// Row 1's unchanged columns take the values of its older change in the batch.
	if v := pgtest.Scalar[string](t, env.Target, `select t || '|' || "we""ird, (col)" || '|' || n || '|' || coalesce(_cdc_unknown::text, 'known') || '|' || (select n from odd_inline where id = 2) from odd_inline where id = 1`); v != "||1.00|known|1234.57" {
		t.Errorf("row 1 = %q, want the older change's text, known, and numerics rounded to the column's scale as COPY does", v)
	}
	tooLong := []changebatch.Change{{Op: changebatch.OpUpsert, Version: changebatch.Version{LSN: 300, Seq: 1},
		Values: []changebatch.Value{text("2"), text("x"), null, null, null, text("abcdef"), null, null, null}}}
	for _, tab := range []changebatch.Table{inline, copied} {
		err := write(tab, tooLong)
		if err == nil || !strings.Contains(err.Error(), "too long") {
			t.Errorf("%s: a value over varchar(5) gave %v, want the server's refusal", tab, err)
		}
	}
	// After an inline refusal the table is staged by COPY, whose error names the row.
	err := write(inline, tooLong)
	if err == nil || !strings.Contains(err.Error(), "the row with key (id) = (2)") {
		t.Errorf("the retry's error = %v, want it to name the row", err)
	}
	if v := pgtest.Scalar[string](t, env.Target, `select v from odd_inline where id = 2`); v != "abcde" {
		t.Errorf("the refused row changed the target: v = %q", v)
	}
}
