package apply

import (
	"bytes"
	"testing"

	"github.com/pgconverge/pgconverge/apply/changebatch"
)

func TestEncodeCopyText(t *testing.T) {
	rows := []stagedRow{
		{op: changebatch.OpUpsert, version: changebatch.Version{LSN: 0x16B3748, Seq: 2},
			values: []changebatch.Value{{Text: "1"}, {Text: "a\tb\\c\nd\re"}, {Null: true}}},
		{op: changebatch.OpDelete, version: changebatch.Version{LSN: 0x1_0000_0000, Seq: 3},
			values: []changebatch.Value{{Text: "2"}, {Null: true}, {Null: true}}},
		{op: changebatch.OpUpsert, version: changebatch.Version{LSN: 5}, moved: true,
			values: []changebatch.Value{{Text: "3"}, {Unchanged: true}, {Text: "7.50"}}},
	}
	var buf bytes.Buffer
	encodeCopyText(&buf, accTable, rows)
	want := "1\ta\\tb\\\\c\\nd\\re\t\\N\t0/16B3748\t2\tf\t\\N\tf\n" +
		"2\t\\N\t\\N\t1/0\t3\tt\t\\N\tf\n" +
		"3\t\\N\t7.50\t0/5\t0\tf\t{\"note\"}\tt\n"
	if got := buf.String(); got != want {
		t.Errorf("copy text:\n%q\nwant:\n%q", got, want)
	}
}

func TestArrayLiteral(t *testing.T) {
	cases := map[string][]string{
		`{"a"}`:                {"a"},
		`{"a b","c,d"}`:        {"a b", "c,d"},
		`{"q\"uote","back\\"}`: {`q"uote`, `back\`},
	}
	for want, in := range cases {
		if got := arrayLiteral(in); got != want {
			t.Errorf("arrayLiteral(%q) = %s, want %s", in, got, want)
		}
	}
}
