-- pgconverge metadata schema, version 16: gap repairs by comparison (run --on-gap=repair).

-- 'gap-repair': a daemon's repair of tables with a coverage gap by comparison at the new
-- snapshot S: only the keys whose rows differ are written. Each table it repaired gets a
-- completed backfills row at S without chunks (one chunk of every key at S, for the ledger), and
-- the run's rows count the rows it wrote (tombstones included).
alter table pgconverge.backfill_runs
    drop constraint backfill_runs_trigger_check,
    add constraint backfill_runs_trigger_check check (trigger in ('initial', 'manual', 'schedule', 'gap', 'schema-change', 'gap-repair'));
