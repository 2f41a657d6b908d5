package apply

import (
	"math"
	"testing"
)

func TestCreateSequenceSQL(t *testing.T) {
	for _, tc := range []struct {
		s    Sequence
		want string
	}{
		{Sequence{Schema: "public", Name: "t_id_seq", DataType: "integer", Start: 1, Increment: 1, Min: 1, Max: math.MaxInt32, Cache: 1},
			`create sequence if not exists "public"."t_id_seq" as integer increment by 1 minvalue 1 maxvalue 2147483647 start with 1 cache 1 no cycle`},
		{Sequence{Schema: "Sales", Name: `Order "Items"_id_seq`, DataType: "bigint", Start: -1, Increment: -5, Min: math.MinInt64, Max: -1, Cache: 20, Cycle: true},
			`create sequence if not exists "Sales"."Order ""Items""_id_seq" as bigint increment by -5 minvalue -9223372036854775808 maxvalue -1 start with -1 cache 20 cycle`},
	} {
		got, err := createSequenceSQL(tc.s)
		if err != nil || got != tc.want {
			t.Errorf("createSequenceSQL(%+v)\n got %s (err %v)\nwant %s", tc.s, got, err, tc.want)
		}
	}
	if _, err := createSequenceSQL(Sequence{Schema: "s", Name: "n", DataType: "numeric; drop table x"}); err == nil {
		t.Error("createSequenceSQL accepted a data type other than smallint, integer or bigint")
	}
}

func TestCompareNext(t *testing.T) {
	v := func(last int64, called bool) SequenceValue { return SequenceValue{LastValue: last, IsCalled: called} }
	for _, tc := range []struct {
		name string
		a    SequenceValue
		aInc int64
		b    SequenceValue
		bInc int64
		want int
	}{
		{"equal", v(5, true), 1, v(5, true), 1, 0},
		{"called is one step ahead", v(5, true), 1, v(5, false), 1, 1},
		{"same next value, different spelling", v(6, false), 1, v(5, true), 1, 0},
		{"behind", v(3, true), 1, v(5, true), 1, -1},
		{"ahead", v(500, true), 1, v(3, true), 1, 1},
		{"other increment", v(10, true), 10, v(15, true), 1, 1},
		{"descending ahead is lower", v(-50, true), -1, v(-3, true), -1, 1},
		{"descending behind is higher", v(-2, true), -1, v(-3, true), -1, -1},
		{"descending not called", v(-3, false), -1, v(-2, true), -1, 0},
		{"past int64", v(math.MaxInt64, true), 1, v(math.MaxInt64, false), 1, 1},
		{"below int64", v(math.MinInt64, true), -1, v(math.MinInt64, false), -1, 1},
	} {
		if got := compareNext(tc.a, tc.aInc, tc.b, tc.bInc); got != tc.want {
			t.Errorf("%s: compareNext(%v, %d, %v, %d) = %d, want %d", tc.name, tc.a, tc.aInc, tc.b, tc.bInc, got, tc.want)
		}
	}
}
