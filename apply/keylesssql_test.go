package apply

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// updateGolden rewrites the golden files of TestKeylessSQL from the code (go test -run
// TestKeylessSQL ./apply -update); review the diff before committing it.
var updateGolden = flag.Bool("update", false, "rewrite the golden SQL files under testdata/")

// keylessGoldenTables are the keyless tables whose statements TestKeylessSQL pins: a small one,
// one whose schema, table and column names need quoting, and one with unusual types.
var keylessGoldenTables = map[string]changebatch.Table{
	"small": {TableName: changebatch.TableName{Schema: "public", Name: "log"}, Keyless: true,
		Columns: []changebatch.Column{{Name: "v", Type: "text"}, {Name: "n", Type: "integer"}}},
	"quoted": {TableName: changebatch.TableName{Schema: "My Schema", Name: `we"ird log`}, Keyless: true,
		Columns: []changebatch.Column{{Name: "Mixed Case", Type: "text"}, {Name: `a "b", (c)`, Type: "integer"}}},
	"types": {TableName: changebatch.TableName{Schema: "public", Name: "events"}, Keyless: true,
		Columns: []changebatch.Column{
			{Name: "at", Type: "timestamp(3) with time zone"},
			{Name: "tags", Type: `"My Schema"."mood"[]`},
			{Name: "bits", Type: "bit varying(8)"},
			{Name: "amount", Type: "numeric(12,4)"},
		}},
}

// keylessStatements returns every statement keyless.go builds for table t, staged in
// "pg_temp"."pgconverge_stage_1", each under a header line naming its builder.
func keylessStatements(t changebatch.Table) string {
	const stageName = "pgconverge_stage_1"
	const stage = `"pg_temp"."pgconverge_stage_1"`
	var b strings.Builder
	add := func(name string, sql ...string) {
		for _, s := range sql {
			b.WriteString("-- " + name + "\n" + s + "\n\n")
		}
	}
	add("RowHashSQL", RowHashSQL(t, "r"))
	add("keylessTableSQL", keylessTableSQL(t)...)
	add("keylessStageSQL", keylessStageSQL(t, stageName))
	add("keylessCopySQL", keylessCopySQL(t, stage))
	add("keylessHashSQL", keylessHashSQL(t, stage))
	add("keylessInsertSQL", keylessInsertSQL(t, stage, false), keylessInsertSQL(t, stage, true))
	add("keylessDeleteSQL", keylessDeleteSQL(t, stage))
	add("keylessSkipNewerSQL", keylessSkipNewerSQL(t, stage))
	add("keylessSupersedeStagedSQL", keylessSupersedeStagedSQL(t, stage))
	add("keylessSnapshotSQL", keylessSnapshotSQL(t, stage))
	add("keylessFenceSQL", keylessFenceSQL(t)...)
	add("rehashSQL", rehashSQL(t))
	add("supersedeSQL", supersedeSQL(t, "e.\"v\" = $2"))
	return b.String()
}

// Every statement built for keyless tables is exactly as pinned in testdata/keyless_*.sql.
func TestKeylessSQL(t *testing.T) {
	for name, tab := range keylessGoldenTables {
		t.Run(name, func(t *testing.T) {
			got := keylessStatements(tab)
			path := filepath.Join("testdata", "keyless_"+name+".sql")
			if *updateGolden {
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if got != string(want) {
				t.Errorf("keyless statements of %s differ from %s:\n%s", tab, path, got)
			}
		})
	}
}
