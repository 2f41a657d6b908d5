package changebatch

import (
	"reflect"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/memory"
)

func TestBuilderViewRoundTrip(t *testing.T) {
	tab := Table{TableName: TableName{Schema: "My Schema", Name: "t"}, Columns: []Column{
		{Name: "id", Type: "bigint", Key: true}, {Name: "body", Type: "text"}, {Name: "n", Type: "numeric(5,2)"},
	}}
	in := []Change{
		{Op: OpUpsert, Version: Version{LSN: 0x10, Seq: 1}, Values: []Value{{Text: "1"}, {Text: ""}, {Null: true}}},
		{Op: OpUpsert, Version: Version{LSN: 0x10, Seq: 2}, Values: []Value{{Text: "1"}, {Unchanged: true}, {Text: "2.50"}}},
		{Op: OpDelete, Version: Version{LSN: 0x20, Seq: 1}, Values: []Value{{Text: "2"}, {Null: true}, {Null: true}}},
		{Op: OpTruncate, Version: Version{LSN: 0x30, Seq: 1}, Values: []Value{{Null: true}, {Null: true}, {Null: true}}},
	}
	mem := memory.NewCheckedAllocator(memory.NewGoAllocator())
	defer mem.AssertSize(t, 0)
	b := NewBuilder(mem, tab)
	for _, c := range in {
		b.Append(c)
	}
	if b.Rows() != 4 {
		t.Fatalf("Rows = %d, want 4", b.Rows())
	}
	rec := b.NewBatch()
	b.Release()
	defer rec.Release()
	v, err := NewView(rec)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(v.Table, tab) {
		t.Errorf("table = %+v, want %+v", v.Table, tab)
	}
	for i, want := range in {
		if got := v.Change(i); !reflect.DeepEqual(got, want) {
			t.Errorf("row %d = %+v, want %+v", i, got, want)
		}
	}
	if got := v.Unchanged(1); !reflect.DeepEqual(got, []string{"body"}) {
		t.Errorf("Unchanged(1) = %v", got)
	}
}

func TestVersionCompare(t *testing.T) {
	cases := []struct {
		a, b Version
		want int
	}{
		{Version{LSN: 1, Seq: 5}, Version{LSN: 2, Seq: 0}, -1},
		{Version{LSN: 2, Seq: 0}, Version{LSN: 2, Seq: 1}, -1},
		{Version{LSN: 2, Seq: 1}, Version{LSN: 2, Seq: 1}, 0},
		{Version{LSN: 3, Seq: 0}, Version{LSN: 2, Seq: 9}, 1},
	}
	for _, c := range cases {
		if got := c.a.Compare(c.b); got != c.want {
			t.Errorf("%s.Compare(%s) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

func TestParseTableName(t *testing.T) {
	cases := []struct{ in, schema, name, err string }{
		{"orders", "public", "orders", ""},
		{"Sales.Orders", "sales", "orders", ""},
		{`"Sales"."Order.Lines"`, "Sales", "Order.Lines", ""},
		{`s."a""b"`, "s", `a"b`, ""},
		{`a.b.c`, "", "", "want schema.table"},
		{`"open`, "", "", "unterminated"},
		{`s.`, "", "", "empty name part"},
	}
	for _, c := range cases {
		n, err := ParseTableName(c.in)
		schema, name := n.Schema, n.Name
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseTableName(%q) err = %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || schema != c.schema || name != c.name {
			t.Errorf("ParseTableName(%q) = %q, %q, %v; want %q, %q", c.in, schema, name, err, c.schema, c.name)
		}
	}
}

func TestQualifiedName(t *testing.T) {
	cases := map[string][2]string{
		"public.orders":        {"public", "orders"},
		`"My Schema"."Order"`:  {"My Schema", "Order"},
		`s."a""b"`:             {"s", `a"b`},
		`public."order.lines"`: {"public", "order.lines"},
	}
	for want, in := range cases {
		if got := QualifiedName(in[0], in[1]); got != want {
			t.Errorf("QualifiedName(%q, %q) = %s, want %s", in[0], in[1], got, want)
		}
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	tab := Table{TableName: TableName{Schema: "public", Name: "t"}, Columns: []Column{{Name: "a"}, {Name: "a"}, {Name: "_cdc_lsn"}}}
	err := tab.Validate()
	for _, want := range []string{"no primary key", `column "a" appears twice`, `"_cdc_lsn" uses a name pgconverge reserves`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to mention %q", err, want)
		}
	}
}

func TestSplitTableList(t *testing.T) {
	got := SplitTableList(`public.a, "My, Schema"."T", b`)
	want := []string{"public.a", `"My, Schema"."T"`, "b"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("SplitTableList = %q, want %q", got, want)
	}
}

func TestQuoteLiteral(t *testing.T) {
	for in, want := range map[string]string{"": `E''`, "plain": `E'plain'`, `it's`: `E'it''s'`, `a\b`: `E'a\\b'`, `\'`: `E'\\'''`} {
		if got := QuoteLiteral(in); got != want {
			t.Errorf("QuoteLiteral(%q) = %s, want %s", in, got, want)
		}
	}
}
