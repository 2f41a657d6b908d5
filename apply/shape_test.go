package apply

import (
	"fmt"
	"testing"
)

// shape builds a sourceShape: filenode, then name, attnum, type oid per column ("g" names a
// generated column with expression "x").
func shape(filenode uint32, cols ...any) sourceShape {
	s := sourceShape{Filenode: filenode, Columns: map[string]shapeColumn{}}
	for i := 0; i < len(cols); i += 3 {
		c := shapeColumn{Attnum: int16(cols[i+1].(int)), TypeOID: uint32(cols[i+2].(int))}
		if cols[i] == "g" {
			c = shapeColumn{Attnum: c.Attnum, Expr: "x"}
		}
		s.Columns[cols[i].(string)] = c
	}
	return s
}

func TestShapeChanges(t *testing.T) {
	base := shape(10, "id", 1, 23, "v", 2, 25, "g", 3, 0)
	for _, tc := range []struct {
		name string
		old  sourceShape
		cur  sourceShape
		want string
	}{
		{"never recorded", sourceShape{}, base, "[]"},
		{"same", base, base, "[]"},
		{"column dropped", base, shape(10, "id", 1, 23, "g", 3, 0), "[]"},
		{"rewritten", base, shape(11, "id", 1, 23, "v", 2, 25, "g", 3, 0), "[table rewritten (relfilenode 10 -> 11)]"},
		{"partitioned (no filenode)", shape(0, "id", 1, 23), shape(0, "id", 1, 23), "[]"},
		{"dropped and added again", base, shape(10, "id", 1, 23, "v", 4, 25, "g", 3, 0), `[column "v" was created again (attnum 2 -> 4)]`},
		{"renamed back", shape(10, "id", 1, 23, "w", 2, 25), shape(10, "id", 1, 23, "v", 2, 25), `[column "v" appeared]`},
		{"type changed", base, shape(10, "id", 1, 20, "v", 2, 25, "g", 3, 0), `[column "id" changed type]`},
		{"plain column appeared", base, shape(10, "id", 1, 23, "v", 2, 25, "h", 4, 23), `[column "h" appeared]`},
		{"generated made plain", base, sourceShape{Filenode: 10, Columns: map[string]shapeColumn{"id": {Attnum: 1, TypeOID: 23}, "v": {Attnum: 2, TypeOID: 25}, "g": {Attnum: 3, TypeOID: 23}}}, `[column "g" is no longer generated]`},
		{"generated re-created", base, shape(10, "id", 1, 23, "v", 2, 25, "g", 5, 0), "[]"},
	} {
		if got := fmt.Sprint(tc.old.changes(tc.cur)); got != tc.want {
			t.Errorf("%s: changes = %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestEnumRenames(t *testing.T) {
	for _, tc := range []struct {
		name       string
		have, want []string
		renames    string
		err        bool
	}{
		{"same", []string{"a", "b"}, []string{"a", "b"}, "[]", false},
		{"added only", []string{"a", "c"}, []string{"a", "b", "c", "d"}, "[]", false},
		{"renamed first", []string{"sad", "ok"}, []string{"blue", "ok"}, `[["sad" "blue"]]`, false},
		{"renamed last, one added before", []string{"a", "z"}, []string{"a", "new", "zz"}, "", true},
		{"renamed and added elsewhere", []string{"a", "b", "c"}, []string{"x", "a", "b", "c2", "d"}, "", true},
		{"renamed two in a row", []string{"a", "b", "c"}, []string{"a", "B", "C"}, `[["b" "B"] ["c" "C"]]`, false},
	} {
		got, err := enumRenames("e", tc.have, tc.want)
		if tc.err != (err != nil) {
			t.Errorf("%s: err = %v, want error %v", tc.name, err, tc.err)
			continue
		}
		if s := fmt.Sprintf("%q", got); !tc.err && s != tc.renames {
			t.Errorf("%s: renames = %s, want %s", tc.name, s, tc.renames)
		}
	}
}
