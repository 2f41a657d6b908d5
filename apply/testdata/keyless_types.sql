-- RowHashSQL
sha256(convert_to(row(r."at", r."tags", r."bits", r."amount")::text, 'UTF8'))

-- keylessTableSQL
create table "public"."events" ("at" timestamp(3) with time zone, "tags" "My Schema"."mood"[], "bits" bit varying(8), "amount" numeric(12,4), "_cdc_row_hash" bytea not null, "_cdc_occurrence" bigint not null, "_cdc_lsn" pg_lsn not null, "_cdc_seq" bigint not null, "_cdc_deleted" boolean not null default false, "_cdc_unknown" text[], "_cdc_deleted_lsn" pg_lsn, "_cdc_deleted_seq" bigint, primary key ("_cdc_row_hash", "_cdc_lsn", "_cdc_seq", "_cdc_occurrence"))

-- keylessTableSQL
create index on "public"."events" ("_cdc_row_hash", "_cdc_lsn", "_cdc_seq", "_cdc_occurrence") where not "_cdc_deleted"

-- keylessTableSQL
create index on "public"."events" ("_cdc_row_hash", "_cdc_deleted_lsn", "_cdc_deleted_seq") where "_cdc_deleted"

-- keylessStageSQL
create temporary table "pgconverge_stage_1" as select "at", "tags", "bits", "amount", "_cdc_lsn", "_cdc_seq", "_cdc_deleted", "_cdc_occurrence", "_cdc_row_hash", 0::int as "_cdc_ord" from "public"."events" with no data

-- keylessCopySQL
copy "pg_temp"."pgconverge_stage_1" ("at", "tags", "bits", "amount", "_cdc_lsn", "_cdc_seq", "_cdc_deleted", "_cdc_occurrence", "_cdc_ord") from stdin

-- keylessHashSQL
update "pg_temp"."pgconverge_stage_1" as s set "_cdc_row_hash" = sha256(convert_to(row(s."at", s."tags", s."bits", s."amount")::text, 'UTF8'))

-- keylessInsertSQL
insert into "public"."events" ("at", "tags", "bits", "amount", "_cdc_row_hash", "_cdc_occurrence", "_cdc_lsn", "_cdc_seq")
select s."at", s."tags", s."bits", s."amount", s."_cdc_row_hash", 1, s."_cdc_lsn", s."_cdc_seq" from (select s."at", s."tags", s."bits", s."amount", s."_cdc_lsn", s."_cdc_seq", s."_cdc_ord", sha256(convert_to(row(s."at", s."tags", s."bits", s."amount")::text, 'UTF8')) as "_cdc_row_hash" from "pg_temp"."pgconverge_stage_1" as s where not s."_cdc_deleted" order by "_cdc_row_hash" offset 0) as s
where not ((s."_cdc_lsn", s."_cdc_seq") <= (select f.fence_lsn, f.fence_seq from pgconverge.tables as f where f.schema_name = $1 and f.table_name = $2) or exists (select 1 from "public"."events" as e where e."_cdc_row_hash" = s."_cdc_row_hash" and (e."_cdc_lsn", e."_cdc_seq") >= (s."_cdc_lsn", s."_cdc_seq") and case when e."_cdc_seq" = 0 then true else (e."_cdc_lsn", e."_cdc_seq", e."_cdc_occurrence") = (s."_cdc_lsn", s."_cdc_seq", 1) end))

-- keylessInsertSQL
insert into "public"."events" ("at", "tags", "bits", "amount", "_cdc_row_hash", "_cdc_occurrence", "_cdc_lsn", "_cdc_seq")
select s."at", s."tags", s."bits", s."amount", s."_cdc_row_hash", 1, s."_cdc_lsn", s."_cdc_seq" from (select s."at", s."tags", s."bits", s."amount", s."_cdc_lsn", s."_cdc_seq", s."_cdc_ord", sha256(convert_to(row(s."at", s."tags", s."bits", s."amount")::text, 'UTF8')) as "_cdc_row_hash" from "pg_temp"."pgconverge_stage_1" as s where not s."_cdc_deleted" order by "_cdc_row_hash" offset 0) as s
where not ((s."_cdc_lsn", s."_cdc_seq") <= (select f.fence_lsn, f.fence_seq from pgconverge.tables as f where f.schema_name = $1 and f.table_name = $2) or exists (select 1 from "public"."events" as e where e."_cdc_row_hash" = s."_cdc_row_hash" and (e."_cdc_lsn", e."_cdc_seq") >= (s."_cdc_lsn", s."_cdc_seq") and case when e."_cdc_seq" = 0 then true else (e."_cdc_lsn", e."_cdc_seq", e."_cdc_occurrence") = (s."_cdc_lsn", s."_cdc_seq", 1) end))
on conflict do nothing

-- keylessDeleteSQL
with n as materialized (select h.*, row_number() over (partition by h."_cdc_row_hash" order by h."_cdc_ord") as _cdc_round from (select s."at", s."tags", s."bits", s."amount", s."_cdc_lsn", s."_cdc_seq", s."_cdc_ord", sha256(convert_to(row(s."at", s."tags", s."bits", s."amount")::text, 'UTF8')) as "_cdc_row_hash" from "pg_temp"."pgconverge_stage_1" as s where s."_cdc_deleted" offset 0) as h),
victim as materialized (select s.*, v.ctid as _cdc_victim from n as s left join lateral (select e.ctid from "public"."events" as e where e."_cdc_row_hash" = s."_cdc_row_hash" and not e."_cdc_deleted" and (e."_cdc_lsn", e."_cdc_seq") < (s."_cdc_lsn", s."_cdc_seq") order by e."_cdc_lsn" desc, e."_cdc_seq" desc, e."_cdc_occurrence" desc limit 1) as v on true
  where s._cdc_round = $3 and not ((s."_cdc_lsn", s."_cdc_seq") <= (select f.fence_lsn, f.fence_seq from pgconverge.tables as f where f.schema_name = $1 and f.table_name = $2) or exists (select 1 from "public"."events" as e where e."_cdc_row_hash" = s."_cdc_row_hash" and e."_cdc_seq" = 0 and (e."_cdc_lsn", e."_cdc_seq") > (s."_cdc_lsn", s."_cdc_seq")) or exists (select 1 from "public"."events" as e where e."_cdc_row_hash" = s."_cdc_row_hash" and e."_cdc_deleted" and e."_cdc_deleted_lsn" = s."_cdc_lsn" and e."_cdc_deleted_seq" = s."_cdc_seq" offset 0))),
killed as (update "public"."events" as e set "_cdc_deleted" = true, "_cdc_deleted_lsn" = x."_cdc_lsn", "_cdc_deleted_seq" = x."_cdc_seq" from victim as x where e.ctid = x._cdc_victim returning 1),
phantom as (insert into "public"."events" ("at", "tags", "bits", "amount", "_cdc_row_hash", "_cdc_occurrence", "_cdc_lsn", "_cdc_seq", "_cdc_deleted", "_cdc_deleted_lsn", "_cdc_deleted_seq") select x."at", x."tags", x."bits", x."amount", x."_cdc_row_hash", 0, x."_cdc_lsn", x."_cdc_seq", true, x."_cdc_lsn", x."_cdc_seq" from victim as x where x._cdc_victim is null returning 1)
select (select count(*) from killed) + (select count(*) from phantom), (select coalesce(max(_cdc_round), 0) from n)

-- keylessSkipNewerSQL
delete from "pg_temp"."pgconverge_stage_1" as s where exists (select 1 from "public"."events" as e where e."_cdc_row_hash" = s."_cdc_row_hash" and e."_cdc_seq" = 0 and (e."_cdc_lsn", e."_cdc_seq") > ($1::pg_lsn, 0))

-- keylessSupersedeStagedSQL
update "public"."events" as e set "_cdc_deleted" = true, "_cdc_deleted_lsn" = $1::pg_lsn, "_cdc_deleted_seq" = 0 where not e."_cdc_deleted" and (e."_cdc_lsn", e."_cdc_seq") < ($1::pg_lsn, 0) and (e."_cdc_row_hash" in (select "_cdc_row_hash" from "pg_temp"."pgconverge_stage_1"))

-- keylessSnapshotSQL
with debts as (select e.ctid as _cdc_debt_id, e."_cdc_row_hash" as _cdc_debt_hash, e."_cdc_deleted_lsn" as _cdc_debt_lsn, e."_cdc_deleted_seq" as _cdc_debt_seq, (e."_cdc_occurrence" = 0 and e."_cdc_seq" > 0) as _cdc_debt_phantom, row_number() over (partition by e."_cdc_row_hash" order by (e."_cdc_deleted_lsn", e."_cdc_deleted_seq")) as _cdc_debt_n from "public"."events" as e where e."_cdc_deleted" and (e."_cdc_deleted_lsn", e."_cdc_deleted_seq") > ($1::pg_lsn, 0::bigint) and ((e."_cdc_lsn", e."_cdc_seq") < ($1::pg_lsn, 0::bigint) or (e."_cdc_occurrence" = 0 and e."_cdc_seq" > 0)) and e."_cdc_row_hash" in (select "_cdc_row_hash" from "pg_temp"."pgconverge_stage_1")),
fresh as (select s.*, row_number() over (partition by s."_cdc_row_hash" order by s."_cdc_occurrence") as _cdc_debt_n from "pg_temp"."pgconverge_stage_1" as s where not exists (select 1 from "public"."events" as e where e."_cdc_row_hash" = s."_cdc_row_hash" and (e."_cdc_lsn", e."_cdc_seq") = ($1::pg_lsn, 0::bigint) and e."_cdc_occurrence" = s."_cdc_occurrence")),
paired as (select f.*, d._cdc_debt_id, d._cdc_debt_lsn, d._cdc_debt_seq, d._cdc_debt_phantom from fresh as f left join debts as d on d._cdc_debt_hash = f."_cdc_row_hash" and d._cdc_debt_n = f._cdc_debt_n),
added as (insert into "public"."events" ("at", "tags", "bits", "amount", "_cdc_row_hash", "_cdc_occurrence", "_cdc_lsn", "_cdc_seq", "_cdc_deleted", "_cdc_deleted_lsn", "_cdc_deleted_seq") select p."at", p."tags", p."bits", p."amount", p."_cdc_row_hash", p."_cdc_occurrence", $1::pg_lsn, 0, p._cdc_debt_id is not null, p._cdc_debt_lsn, p._cdc_debt_seq from paired as p returning 1),
gone as (delete from "public"."events" as e using paired as p where p._cdc_debt_phantom and e.ctid = p._cdc_debt_id),
replaced as (update "public"."events" as e set "_cdc_deleted_lsn" = $1::pg_lsn, "_cdc_deleted_seq" = 0 from paired as p where not p._cdc_debt_phantom and e.ctid = p._cdc_debt_id)
select count(*) from added

-- keylessFenceSQL
update "public"."events" set "_cdc_deleted" = true, "_cdc_deleted_lsn" = $1::pg_lsn, "_cdc_deleted_seq" = $2 where not "_cdc_deleted" and ("_cdc_lsn", "_cdc_seq") < ($1::pg_lsn, $2)

-- keylessFenceSQL
delete from "public"."events" where "_cdc_deleted" and "_cdc_occurrence" = 0 and "_cdc_seq" > 0 and ("_cdc_deleted_lsn", "_cdc_deleted_seq") <= ($1::pg_lsn, $2)

-- rehashSQL
update "public"."events" as r set "_cdc_row_hash" = sha256(convert_to(row(r."at", r."tags", r."bits", r."amount")::text, 'UTF8')) where "_cdc_row_hash" <> sha256(convert_to(row(r."at", r."tags", r."bits", r."amount")::text, 'UTF8'))

-- supersedeSQL
update "public"."events" as e set "_cdc_deleted" = true, "_cdc_deleted_lsn" = $1::pg_lsn, "_cdc_deleted_seq" = 0 where not e."_cdc_deleted" and (e."_cdc_lsn", e."_cdc_seq") < ($1::pg_lsn, 0) and (e."v" = $2)

