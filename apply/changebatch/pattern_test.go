package changebatch

import "testing"

func TestParseTableSelection(t *testing.T) {
	names, patterns, err := ParseTableSelection([]string{`public.*,sales.order_?x, a`, `"Odd*".t`, `"s".*`, `public.*`})
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 2 || names[0] != (TableName{"public", "a"}) || names[1] != (TableName{"Odd*", "t"}) {
		t.Errorf("names %v, want public.a and the quoted \"Odd*\".t", names)
	}
	if len(patterns) != 3 {
		t.Fatalf("patterns %v, want 3 (duplicates dropped)", patterns)
	}
	cases := []struct {
		p    int
		n    TableName
		want bool
	}{
		{0, TableName{"public", "orders"}, true},
		{0, TableName{"sales", "orders"}, false},
		{1, TableName{"sales", "order_1x"}, true},
		{1, TableName{"sales", "order_12x"}, false},
		{1, TableName{"sales", "ORDER_1x"}, false},
		{2, TableName{"s", "anything"}, true},
		{2, TableName{"S", "anything"}, false},
	}
	for _, c := range cases {
		if got := patterns[c.p].Match(c.n); got != c.want {
			t.Errorf("%s matches %s: %v, want %v", patterns[c.p], c.n, got, c.want)
		}
	}
	if _, _, err := ParseTableSelection([]string{`a.b.*`}); err == nil {
		t.Error("a three-part pattern was accepted")
	}
}
