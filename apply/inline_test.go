package apply

import (
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

func TestInlineRecords(t *testing.T) {
	ver := changebatch.Version{LSN: pglogrepl.LSN(0x16B3748), Seq: 7}
	rows := []stagedRow{
		{op: changebatch.OpUpsert, version: ver, values: []changebatch.Value{{Text: "1"}, {Text: `a "q", (p) \ b`}, {Null: true}}},
		{op: changebatch.OpUpsert, version: ver, values: []changebatch.Value{{Text: "2"}, {Text: ""}, {Text: " 3.50 "}}},
		{op: changebatch.OpDelete, version: ver, values: []changebatch.Value{{Text: "3"}, {Null: true}, {Null: true}}},
		{op: changebatch.OpUpsert, version: ver, values: []changebatch.Value{{Text: "4"}, {Unchanged: true}, {Text: "1"}}, moved: true},
	}
	want := []string{
		`("1","a \"q\", (p) \\ b",,0/16B3748,7,f,,f)`,
		`("2",""," 3.50 ",0/16B3748,7,f,,f)`,
		`("3",,,0/16B3748,7,t,,f)`,
		`("4",,"1",0/16B3748,7,f,"{\"note\"}",t)`,
	}
	if got := inlineRecords(copyOnlyIn{}, accTable, rows); !reflect.DeepEqual(got, want) {
		t.Errorf("inlineRecords:\n%q\nwant\n%q", got, want)
	}
	big := []stagedRow{{values: []changebatch.Value{{Text: "1"}, {Text: strings.Repeat("x", inlineBytes+1)}, {Null: true}}}}
	if got := inlineRecords(copyOnlyIn{}, accTable, big); got != nil {
		t.Errorf("a piece over %d bytes is inline", inlineBytes)
	}
	if got := inlineRecords(copyOnlyIn{}, accTable, make([]stagedRow, inlineRows+1)); got != nil {
		t.Errorf("a piece over %d rows is inline", inlineRows)
	}
}

func TestInlineUpsertReadsTheRecordsParameter(t *testing.T) {
	recs := []string{`("1",,,0/1,1,f,,f)`}
	got, args := upsertSQL(accTable, source{stage: "pgconverge_stage_1", records: recs}, false)
	if from := `from unnest($6::text[]::"pg_temp"."pgconverge_stage_1"[]) as stg` + "\n"; !strings.Contains(got, from) {
		t.Errorf("upsertSQL does not read %q:\n%s", from, got)
	}
	if want := []any{"public", "Acc", false, "note", "bal", recs}; !reflect.DeepEqual(args, want) {
		t.Errorf("args = %v, want %v", args, want)
	}
}
