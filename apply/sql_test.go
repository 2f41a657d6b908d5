package apply

import (
	"reflect"
	"testing"

	"github.com/pgconverge/pgconverge/apply/changebatch"
)

var accTable = changebatch.Table{TableName: changebatch.TableName{Schema: "public", Name: "Acc"}, Columns: []changebatch.Column{
	{Name: "id", Type: "integer", Key: true},
	{Name: "note", Type: "text"},
	{Name: "bal", Type: "numeric(10,2)"},
}}

func TestUpsertSQL(t *testing.T) {
	const want = `insert into "public"."Acc" as tgt ("id", "note", "bal", "_cdc_lsn", "_cdc_seq", "_cdc_deleted", "_cdc_unknown")
select "id", "note", "bal", "_cdc_lsn", "_cdc_seq", "_cdc_deleted", "_cdc_unknown" from (select distinct on ("id") "id", "note", "bal", "_cdc_lsn", "_cdc_seq", "_cdc_deleted", "_cdc_unknown", "_cdc_moved" from "pg_temp"."pgconverge_stage_1" as stg
  where not exists (select 1 from pgconverge.tables as f where f.schema_name = $1 and f.table_name = $2 and (f.fence_lsn, f.fence_seq) >= (stg."_cdc_lsn", stg."_cdc_seq"))
  order by "id", stg."_cdc_lsn" desc, stg."_cdc_seq" desc, stg."_cdc_deleted") as newest
where "_cdc_moved" = $3
on conflict ("id") do update set
  "id" = case when (tgt."_cdc_lsn", tgt."_cdc_seq") < (excluded."_cdc_lsn", excluded."_cdc_seq") then excluded."id" else tgt."id" end,
  "note" = case when (tgt."_cdc_lsn", tgt."_cdc_seq") < (excluded."_cdc_lsn", excluded."_cdc_seq") then case when $4::text = any (excluded."_cdc_unknown") then tgt."note" else excluded."note" end when $4::text = any (tgt."_cdc_unknown") then excluded."note" else tgt."note" end,
  "bal" = case when (tgt."_cdc_lsn", tgt."_cdc_seq") < (excluded."_cdc_lsn", excluded."_cdc_seq") then case when $5::text = any (excluded."_cdc_unknown") then tgt."bal" else excluded."bal" end when $5::text = any (tgt."_cdc_unknown") then excluded."bal" else tgt."bal" end,
  "_cdc_lsn" = case when (tgt."_cdc_lsn", tgt."_cdc_seq") < (excluded."_cdc_lsn", excluded."_cdc_seq") then excluded."_cdc_lsn" else tgt."_cdc_lsn" end,
  "_cdc_seq" = case when (tgt."_cdc_lsn", tgt."_cdc_seq") < (excluded."_cdc_lsn", excluded."_cdc_seq") then excluded."_cdc_seq" else tgt."_cdc_seq" end,
  "_cdc_deleted" = case when (tgt."_cdc_lsn", tgt."_cdc_seq") < (excluded."_cdc_lsn", excluded."_cdc_seq") then excluded."_cdc_deleted" else tgt."_cdc_deleted" end,
  "_cdc_unknown" = case when not (tgt."_cdc_lsn", tgt."_cdc_seq") < (excluded."_cdc_lsn", excluded."_cdc_seq") then null when excluded."_cdc_unknown" is null then null when tgt."_cdc_deleted" then excluded."_cdc_unknown" else nullif(array(select unnest(excluded."_cdc_unknown") intersect select unnest(tgt."_cdc_unknown")), '{}') end
where (tgt."_cdc_lsn", tgt."_cdc_seq") < (excluded."_cdc_lsn", excluded."_cdc_seq")
  or (excluded."_cdc_seq" = 0 and not excluded."_cdc_deleted" and not tgt."_cdc_deleted" and tgt."_cdc_unknown" is not null)`
	got, args := upsertSQL(accTable, source{stage: "pgconverge_stage_1"}, false)
	if got != want {
		t.Errorf("upsertSQL:\n%s\nwant:\n%s", got, want)
	}
	if wantArgs := []any{"public", "Acc", false, "note", "bal"}; !reflect.DeepEqual(args, wantArgs) {
		t.Errorf("args = %v, want %v", args, wantArgs)
	}
}

// Moved rows (the new key of a key change whose unchanged columns are still unknown) never take
// values from the target row of the new key.
func TestUpsertSQLMovedRows(t *testing.T) {
	const want = `insert into "public"."Acc" as tgt ("id", "note", "bal", "_cdc_lsn", "_cdc_seq", "_cdc_deleted", "_cdc_unknown")
select "id", "note", "bal", "_cdc_lsn", "_cdc_seq", "_cdc_deleted", "_cdc_unknown" from (select distinct on ("id") "id", "note", "bal", "_cdc_lsn", "_cdc_seq", "_cdc_deleted", "_cdc_unknown", "_cdc_moved" from "pg_temp"."pgconverge_stage_1" as stg
  where not exists (select 1 from pgconverge.tables as f where f.schema_name = $1 and f.table_name = $2 and (f.fence_lsn, f.fence_seq) >= (stg."_cdc_lsn", stg."_cdc_seq"))
  order by "id", stg."_cdc_lsn" desc, stg."_cdc_seq" desc, stg."_cdc_deleted") as newest
where "_cdc_moved" = $3
on conflict ("id") do update set
  "id" = excluded."id",
  "note" = excluded."note",
  "bal" = excluded."bal",
  "_cdc_lsn" = excluded."_cdc_lsn",
  "_cdc_seq" = excluded."_cdc_seq",
  "_cdc_deleted" = excluded."_cdc_deleted",
  "_cdc_unknown" = excluded."_cdc_unknown"
where (tgt."_cdc_lsn", tgt."_cdc_seq") < (excluded."_cdc_lsn", excluded."_cdc_seq")`
	got, args := upsertSQL(accTable, source{stage: "pgconverge_stage_1"}, true)
	if got != want {
		t.Errorf("upsertSQL:\n%s\nwant:\n%s", got, want)
	}
	if wantArgs := []any{"public", "Acc", true}; !reflect.DeepEqual(args, wantArgs) {
		t.Errorf("args = %v, want %v", args, wantArgs)
	}
}

func TestUpsertSQLCompositeKeyOnly(t *testing.T) {
	tab := changebatch.Table{TableName: changebatch.TableName{Schema: "s", Name: "link"}, Columns: []changebatch.Column{
		{Name: "a", Type: "bigint", Key: true}, {Name: "b", Type: "text", Key: true},
	}}
	const want = `insert into "s"."link" as tgt ("a", "b", "_cdc_lsn", "_cdc_seq", "_cdc_deleted", "_cdc_unknown")
select "a", "b", "_cdc_lsn", "_cdc_seq", "_cdc_deleted", "_cdc_unknown" from (select distinct on ("a", "b") "a", "b", "_cdc_lsn", "_cdc_seq", "_cdc_deleted", "_cdc_unknown", "_cdc_moved" from "pg_temp"."st" as stg
  where not exists (select 1 from pgconverge.tables as f where f.schema_name = $1 and f.table_name = $2 and (f.fence_lsn, f.fence_seq) >= (stg."_cdc_lsn", stg."_cdc_seq"))
  order by "a", "b", stg."_cdc_lsn" desc, stg."_cdc_seq" desc, stg."_cdc_deleted") as newest
where "_cdc_moved" = $3
on conflict ("a", "b") do update set
  "a" = case when (tgt."_cdc_lsn", tgt."_cdc_seq") < (excluded."_cdc_lsn", excluded."_cdc_seq") then excluded."a" else tgt."a" end,
  "b" = case when (tgt."_cdc_lsn", tgt."_cdc_seq") < (excluded."_cdc_lsn", excluded."_cdc_seq") then excluded."b" else tgt."b" end,
  "_cdc_lsn" = case when (tgt."_cdc_lsn", tgt."_cdc_seq") < (excluded."_cdc_lsn", excluded."_cdc_seq") then excluded."_cdc_lsn" else tgt."_cdc_lsn" end,
  "_cdc_seq" = case when (tgt."_cdc_lsn", tgt."_cdc_seq") < (excluded."_cdc_lsn", excluded."_cdc_seq") then excluded."_cdc_seq" else tgt."_cdc_seq" end,
  "_cdc_deleted" = case when (tgt."_cdc_lsn", tgt."_cdc_seq") < (excluded."_cdc_lsn", excluded."_cdc_seq") then excluded."_cdc_deleted" else tgt."_cdc_deleted" end,
  "_cdc_unknown" = case when not (tgt."_cdc_lsn", tgt."_cdc_seq") < (excluded."_cdc_lsn", excluded."_cdc_seq") then null when excluded."_cdc_unknown" is null then null when tgt."_cdc_deleted" then excluded."_cdc_unknown" else nullif(array(select unnest(excluded."_cdc_unknown") intersect select unnest(tgt."_cdc_unknown")), '{}') end
where (tgt."_cdc_lsn", tgt."_cdc_seq") < (excluded."_cdc_lsn", excluded."_cdc_seq")
  or (excluded."_cdc_seq" = 0 and not excluded."_cdc_deleted" and not tgt."_cdc_deleted" and tgt."_cdc_unknown" is not null)`
	if got, _ := upsertSQL(tab, source{stage: "st"}, false); got != want {
		t.Errorf("upsertSQL:\n%s\nwant:\n%s", got, want)
	}
}

func TestDDL(t *testing.T) {
	cases := []struct{ name, got, want string }{
		{"create table", createTableSQL(accTable), `create table if not exists "public"."Acc" ("id" integer not null, "note" text, "bal" numeric(10,2), "_cdc_lsn" pg_lsn not null, "_cdc_seq" bigint not null, "_cdc_deleted" boolean not null default false, "_cdc_unknown" text[], primary key ("id"))`},
		{"create stage", createStageSQL(accTable, "pgconverge_stage_1"), `create temporary table "pgconverge_stage_1" as select "id", "note", "bal", "_cdc_lsn", "_cdc_seq", "_cdc_deleted", "_cdc_unknown", false as "_cdc_moved" from "public"."Acc" with no data`},
		{"copy", copySQL(accTable, "pgconverge_stage_1"), `copy "pg_temp"."pgconverge_stage_1" ("id", "note", "bal", "_cdc_lsn", "_cdc_seq", "_cdc_deleted", "_cdc_unknown", "_cdc_moved") from stdin`},
		{"lookup", lookupSQL(accTable), `select "note"::text, "bal"::text, coalesce("_cdc_unknown", '{}'), "_cdc_lsn"::text, "_cdc_seq" from "public"."Acc" where "id" = cast($1::text as integer) and not "_cdc_deleted" and ("_cdc_lsn", "_cdc_seq") < ($2::pg_lsn, $3) and ("_cdc_lsn", "_cdc_seq") >= ($4::pg_lsn, $5)`},
		{"tombstone before", tombstoneBeforeSQL(accTable), `update "public"."Acc" set "_cdc_deleted" = true, "_cdc_lsn" = $1::pg_lsn, "_cdc_seq" = $2, "_cdc_unknown" = null where not "_cdc_deleted" and ("_cdc_lsn", "_cdc_seq") < ($1::pg_lsn, $2)`},
	}
	for _, c := range cases {
		if c.got != c.want {
			t.Errorf("%s:\n%s\nwant:\n%s", c.name, c.got, c.want)
		}
	}
}
