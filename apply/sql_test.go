package apply

import (
	"reflect"
	"testing"

	"github.com/pgconverge/pgconverge/apply/changebatch"
)

var accTable = changebatch.Table{Schema: "public", Name: "Acc", Columns: []changebatch.Column{
	{Name: "id", Type: "integer", Key: true},
	{Name: "note", Type: "text"},
	{Name: "bal", Type: "numeric(10,2)"},
}}

func TestUpsertSQL(t *testing.T) {
	const want = `insert into "public"."Acc" as tgt ("id", "note", "bal", "_cdc_lsn", "_cdc_seq", "_cdc_deleted", "_cdc_unknown")
select "id", "note", "bal", "_cdc_lsn", "_cdc_seq", "_cdc_deleted", "_cdc_unknown" from "pg_temp"."pgconverge_stage_1" as stg
where not exists (select 1 from pgconverge.tables as f where f.schema_name = $1 and f.table_name = $2 and (f.fence_lsn, f.fence_seq) >= (stg."_cdc_lsn", stg."_cdc_seq"))
on conflict ("id") do update set
  "note" = case when $3::text = any (excluded."_cdc_unknown") then tgt."note" else excluded."note" end,
  "bal" = case when $4::text = any (excluded."_cdc_unknown") then tgt."bal" else excluded."bal" end,
  "_cdc_lsn" = excluded."_cdc_lsn",
  "_cdc_seq" = excluded."_cdc_seq",
  "_cdc_deleted" = excluded."_cdc_deleted",
  "_cdc_unknown" = case when excluded."_cdc_unknown" is null then null when tgt."_cdc_deleted" then excluded."_cdc_unknown" else nullif(array(select unnest(excluded."_cdc_unknown") intersect select unnest(tgt."_cdc_unknown")), '{}') end
where (tgt."_cdc_lsn", tgt."_cdc_seq") < (excluded."_cdc_lsn", excluded."_cdc_seq")`
	got, args := upsertSQL(accTable, "pgconverge_stage_1")
	if got != want {
		t.Errorf("upsertSQL:\n%s\nwant:\n%s", got, want)
	}
	if wantArgs := []any{"public", "Acc", "note", "bal"}; !reflect.DeepEqual(args, wantArgs) {
		t.Errorf("args = %v, want %v", args, wantArgs)
	}
}

func TestUpsertSQLCompositeKeyOnly(t *testing.T) {
	tab := changebatch.Table{Schema: "s", Name: "link", Columns: []changebatch.Column{
		{Name: "a", Type: "bigint", Key: true}, {Name: "b", Type: "text", Key: true},
	}}
	const want = `insert into "s"."link" as tgt ("a", "b", "_cdc_lsn", "_cdc_seq", "_cdc_deleted", "_cdc_unknown")
select "a", "b", "_cdc_lsn", "_cdc_seq", "_cdc_deleted", "_cdc_unknown" from "pg_temp"."st" as stg
where not exists (select 1 from pgconverge.tables as f where f.schema_name = $1 and f.table_name = $2 and (f.fence_lsn, f.fence_seq) >= (stg."_cdc_lsn", stg."_cdc_seq"))
on conflict ("a", "b") do update set
  "_cdc_lsn" = excluded."_cdc_lsn",
  "_cdc_seq" = excluded."_cdc_seq",
  "_cdc_deleted" = excluded."_cdc_deleted",
  "_cdc_unknown" = case when excluded."_cdc_unknown" is null then null when tgt."_cdc_deleted" then excluded."_cdc_unknown" else nullif(array(select unnest(excluded."_cdc_unknown") intersect select unnest(tgt."_cdc_unknown")), '{}') end
where (tgt."_cdc_lsn", tgt."_cdc_seq") < (excluded."_cdc_lsn", excluded."_cdc_seq")`
	if got, _ := upsertSQL(tab, "st"); got != want {
		t.Errorf("upsertSQL:\n%s\nwant:\n%s", got, want)
	}
}

func TestDDL(t *testing.T) {
	cases := []struct{ name, got, want string }{
		{"create table", createTableSQL(accTable), `create table if not exists "public"."Acc" ("id" integer not null, "note" text, "bal" numeric(10,2), "_cdc_lsn" pg_lsn not null, "_cdc_seq" bigint not null, "_cdc_deleted" boolean not null default false, "_cdc_unknown" text[], primary key ("id"))`},
		{"create stage", createStageSQL(accTable, "pgconverge_stage_1"), `create temporary table "pgconverge_stage_1" (like "public"."Acc") on commit delete rows`},
		{"copy", copySQL(accTable, "pgconverge_stage_1"), `copy "pg_temp"."pgconverge_stage_1" ("id", "note", "bal", "_cdc_lsn", "_cdc_seq", "_cdc_deleted", "_cdc_unknown") from stdin`},
		{"truncate", truncateSQL(accTable), `update "public"."Acc" set "_cdc_deleted" = true, "_cdc_lsn" = $1::pg_lsn, "_cdc_seq" = $2, "_cdc_unknown" = null where not "_cdc_deleted" and ("_cdc_lsn", "_cdc_seq") < ($1::pg_lsn, $2)`},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("%s:\n%s\nwant:\n%s", c.name, c.got, c.want)
		}
	}
}
