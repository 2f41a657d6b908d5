package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/internal/tableschema"
)

// indexFollowEvery is how often the daemon compares the source's indexes with the target's
// (Config.CopyIndexes): CREATE INDEX and DROP INDEX on the source write no logical change.
const indexFollowEvery = time.Minute

// indexFollower builds the source's secondary indexes on the streamed target tables once they
// are loaded, and follows the source's index changes (Config.CopyIndexes): each round it builds,
// with CREATE INDEX CONCURRENTLY on a connection of its own, the indexes tableschema.Replicated
// gives for a table that its target table lacks, and drops (DROP INDEX CONCURRENTLY) those it
// built that the source no longer has or whose definition changed. What it built is recorded in
// pgconverge.target_indexes; an index of the target it did not build is the operator's and is
// never touched. A build that fails (a function, operator class or extension the target lacks)
// is logged at ERROR with the fix, counted, and tried again next round: it never stops the stream.
type indexFollower struct {
	cfg    Config
	mon    Monitor
	tables []changebatch.Table
	every  time.Duration
	// told are the problems logged already, so that each is logged once per session.
	told map[string]bool
}

func newIndexFollower(cfg Config, mon Monitor, tables []changebatch.Table) *indexFollower {
	return &indexFollower{cfg: cfg, mon: mon, tables: tables, every: knobOr(cfg.Knobs.IndexFollowEvery, indexFollowEvery), told: map[string]bool{}}
}

// Run follows the indexes every interval, starting at once, until ctx ends; it returns nil.
func (f *indexFollower) Run(ctx context.Context) error {
	if !f.cfg.CopyIndexes {
		return nil
	}
	periodically(ctx, f.every, true, func() {
		if err := f.round(ctx); err != nil && ctx.Err() == nil {
			f.cfg.Logger.Warn("indexes not followed: tried again at the next round", "err", err)
		}
	})
	return nil
}

func (f *indexFollower) round(ctx context.Context) error {
	src, tgt, err := pgsession.ConnectBoth(ctx, f.cfg.Source, f.cfg.Target)
	if err != nil {
		return err
	}
	defer pgsession.CloseBoth(context.WithoutCancel(ctx), src, tgt)
	for _, t := range f.tables {
		if err := f.table(ctx, src, tgt, t.TableName); err != nil {
			return err
		}
	}
	return nil
}

// table brings table t's indexes on tgt in line with the source's, once t is loaded.
func (f *indexFollower) table(ctx context.Context, src, tgt *pgx.Conn, t changebatch.TableName) error {
	var loaded bool
	err := tgt.QueryRow(ctx, `select loaded_lsn is not null and to_regclass(format('%I.%I', schema_name, table_name)) is not null
from pgconverge.tables where schema_name = $1 and table_name = $2`, t.Schema, t.Name).Scan(&loaded)
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && !loaded) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the load state of %s: %w", t, err)
	}
	s, err := tableschema.Read(ctx, src, t)
	if errors.Is(err, tableschema.ErrNoTable) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("source: %w", err)
	}
	want, skipped := tableschema.Replicated(s)
	for _, why := range skipped {
		f.tellOnce(t, why, "source index not built on the target: build it there yourself if queries need it")
	}
	built, present, err := targetIndexes(ctx, tgt, t)
	if err != nil {
		return err
	}
	wanted := map[string]string{}
	for _, w := range want {
		wanted[w.Name] = w.Def
	}
	for name, def := range built {
		if wanted[name] != def {
			if err := f.drop(ctx, tgt, t, name); err != nil {
				return err
			}
			delete(built, name)
			delete(present, name)
		}
	}
	for _, w := range want {
		valid, exists := present[w.Name]
		_, ours := built[w.Name]
		switch {
		case exists && valid && ours:
		case exists && !ours:
			f.tellOnce(t, w.Name, "an index of the source's name exists on the target and is not pgconverge's: left as it is")
		default:
			if exists { // built by an earlier round that was interrupted: invalid
				if err := f.drop(ctx, tgt, t, w.Name); err != nil {
					return err
				}
			}
			f.build(ctx, tgt, t, w)
		}
	}
	return nil
}

// build builds index w on table t and records it; a failure is logged, counted and left to the
// next round (an invalid index it left is dropped then).
func (f *indexFollower) build(ctx context.Context, tgt *pgx.Conn, t changebatch.TableName, w tableschema.ReplicatedIndex) {
	started := time.Now()
	if _, err := tgt.Exec(ctx, w.Concurrently()); err != nil {
		if ctx.Err() != nil {
			return
		}
		f.mon.TargetIndex(t.String(), "failed")
		f.cfg.Logger.Error("source index not built on the target: tried again at the next round", "table", t.String(), "index", w.Name,
			"source_index", w.Source, "statement", w.Concurrently(), "err", err,
			"hint", "create what the index needs on the target (a function, operator class, collation or extension the source has)")
		return
	}
	_, err := tgt.Exec(ctx, `insert into pgconverge.target_indexes (schema_name, table_name, index_name, definition, source_index)
values ($1, $2, $3, $4, $5) on conflict (schema_name, table_name, index_name) do update set definition = excluded.definition,
  source_index = excluded.source_index, built_at = now()`, t.Schema, t.Name, w.Name, w.Def, w.Source)
	if err != nil {
		f.cfg.Logger.Warn("index built on the target but not recorded: the next round builds it again", "table", t.String(), "index", w.Name, "err", err)
		return
	}
	f.mon.TargetIndex(t.String(), "built")
	f.cfg.Logger.Info("built a source index on the target", "table", t.String(), "index", w.Name, "source_index", w.Source,
		"seconds", fmt.Sprintf("%.1f", time.Since(started).Seconds()))
}

// drop drops index name of table t, which pgconverge built, and its record.
func (f *indexFollower) drop(ctx context.Context, tgt *pgx.Conn, t changebatch.TableName, name string) error {
	if _, err := tgt.Exec(ctx, "drop index concurrently if exists "+pgx.Identifier{t.Schema, name}.Sanitize()); err != nil {
		return fmt.Errorf("drop index %s of %s on the target: %w", name, t, err)
	}
	if _, err := tgt.Exec(ctx, `delete from pgconverge.target_indexes where schema_name = $1 and table_name = $2 and index_name = $3`,
		t.Schema, t.Name, name); err != nil {
		return fmt.Errorf("forget index %s of %s: %w", name, t, err)
	}
	f.mon.TargetIndex(t.String(), "dropped")
	f.cfg.Logger.Info("dropped an index the source no longer has (or has otherwise)", "table", t.String(), "index", name)
	return nil
}

func (f *indexFollower) tellOnce(t changebatch.TableName, what, msg string) {
	key := t.String() + "\x00" + what
	if !f.told[key] {
		f.told[key] = true
		f.cfg.Logger.Warn(msg, "table", t.String(), "index", what)
	}
}

// targetIndexes returns the indexes pgconverge built on table t (name: definition), and every
// index t has on tgt (name: valid).
func targetIndexes(ctx context.Context, tgt *pgx.Conn, t changebatch.TableName) (built map[string]string, present map[string]bool, err error) {
	built, present = map[string]string{}, map[string]bool{}
	rows, err := tgt.Query(ctx, `select index_name, definition from pgconverge.target_indexes where schema_name = $1 and table_name = $2`, t.Schema, t.Name)
	if err != nil {
		return nil, nil, fmt.Errorf("read the indexes built on %s: %w", t, err)
	}
	var name, def string
	if _, err := pgx.ForEachRow(rows, []any{&name, &def}, func() error { built[name] = def; return nil }); err != nil {
		return nil, nil, fmt.Errorf("read the indexes built on %s: %w", t, err)
	}
	rows, err = tgt.Query(ctx, `select c.relname::text, i.indisvalid from pg_index i join pg_class c on c.oid = i.indexrelid
where i.indrelid = $1::regclass`, t.Quoted())
	if err != nil {
		return nil, nil, fmt.Errorf("read the indexes of %s on the target: %w", t, err)
	}
	var valid bool
	if _, err := pgx.ForEachRow(rows, []any{&name, &valid}, func() error { present[name] = valid; return nil }); err != nil {
		return nil, nil, fmt.Errorf("read the indexes of %s on the target: %w", t, err)
	}
	return built, present, nil
}
