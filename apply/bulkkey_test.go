package apply_test

import (
	"context"
	"fmt"
	"io"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/pgconverge/pgconverge/apply"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/pgsession"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// During a bulk load at (S, 0) (DeferKey) the direct COPY names the data columns alone and the
// target fills the version from its defaults: the source's text passes through unchanged, and,
// between servers of one major version and built-in types, its binary output does. A COPY at
// another version still appends the version to each line. RestoreKey builds the key and drops
// the defaults.
func TestBulkLoadCopiesWithTheVersionDefaults(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	typed := acc
	typed.Columns = []changebatch.Column{
		{Name: "id", Type: "integer", TypeOID: 23, Key: true},
		{Name: "note", Type: "text", TypeOID: 25},
		{Name: "bal", Type: "integer", TypeOID: 23},
	}
	if err := apply.DeferKey(ctx, f.env.Target, typed, changebatch.Version{LSN: 400}); err != nil {
		t.Fatal(err)
	}
	pgtest.Exec(t, f.env.Source, `create table acc (id int primary key, note text, bal int)`,
		`insert into acc values (3, E'tab\there, back\\slash', 30), (4, null, 40), (5, '\N', 50)`)
	sourceMajor := pgsession.MajorVersion(f.env.Source.PgConn())
	var asked []bool
	bulkCopy := func(lsn uint64, sourceMajor int, rows CopyLines) apply.Result {
		var res apply.Result
		f.inTx(t, func(ctx context.Context, tx *apply.Tx) (bool, error) {
			var conflict bool
			var err error
			res, _, conflict, err = tx.CopySnapshotRows(ctx, typed, changebatch.Version{LSN: pglogrepl.LSN(lsn)}, sourceMajor,
				func(w io.Writer, binary bool) (int64, error) {
					asked = append(asked, binary)
					return rows(ctx, w, binary)
				})
			if conflict {
				t.Fatal("bulk copy: conflict")
			}
			return true, err
		})
		return res
	}
	lines := func(ls ...string) CopyLines {
		return func(_ context.Context, w io.Writer, _ bool) (int64, error) {
			for _, l := range ls {
				if _, err := io.WriteString(w, l+"\n"); err != nil {
					return 0, err
				}
			}
			return int64(len(ls)), nil
		}
	}
	fromSource := func(ctx context.Context, w io.Writer, binary bool) (int64, error) {
		sql := "copy (select id, note, bal from acc order by id) to stdout"
		if binary {
			sql += " with (format binary)"
		}
		tag, err := f.env.Source.PgConn().CopyTo(ctx, w, sql)
		return tag.RowsAffected(), err
	}
	if res := bulkCopy(400, 0, lines("1\tone\t10", `2	\\N	20`)); !reflect.DeepEqual(res, apply.Result{Applied: 2}) {
		t.Fatalf("text bulk copy = %+v, want 2 applied", res)
	}
	if res := bulkCopy(400, sourceMajor, fromSource); !reflect.DeepEqual(res, apply.Result{Applied: 3}) {
		t.Fatalf("binary bulk copy = %+v, want 3 applied", res)
	}
	if res := bulkCopy(500, sourceMajor, lines("6\tsix\t60")); !reflect.DeepEqual(res, apply.Result{Applied: 1}) {
		t.Fatalf("copy at another version = %+v, want 1 applied", res)
	}
	if want := []bool{false, true, false}; !reflect.DeepEqual(asked, want) {
		t.Errorf("binary asked for %v, want %v (text without the source's version, binary in the bulk load, text at another version)", asked, want)
	}
	f.expect(t, "1|one|10|0/190#0|f|", `2|\N|20|0/190#0|f|`, "3|tab\there, back\\slash|30|0/190#0|f|", "4||40|0/190#0|f|",
		`5|\N|50|0/190#0|f|`, "6|six|60|0/1F4#0|f|")

	if err := pgx.BeginFunc(ctx, f.env.Target, func(tx pgx.Tx) error { _, err := apply.RestoreKey(ctx, tx, typed); return err }); err != nil {
		t.Fatal(err)
	}
	got := pgtest.Rows(t, f.env.Target, `select a.attname || ' ' || pg_get_expr(d.adbin, d.adrelid) from pg_attrdef d
join pg_attribute a on a.attrelid = d.adrelid and a.attnum = d.adnum where d.adrelid = 'acc'::regclass
union all select conname::text from pg_constraint where conrelid = 'acc'::regclass and contype = 'p'`)
	if d := pgtest.Diff([]string{"_cdc_deleted false", "acc_pkey"}, got); d != "" {
		t.Errorf("after RestoreKey (defaults, key): %s", d)
	}
}

// CopyLines writes rows for a COPY as CopyRows does, with the test's context.
type CopyLines func(ctx context.Context, w io.Writer, binary bool) (int64, error)

// A bulk load's COPY and another process's RestoreKey (a daemon or a second backfill starting
// while the load runs) race: the COPY must not read the version defaults, wait for the ALTER
// TABLE that drops them, and then copy without them (a NOT NULL violation). It waits before it
// reads them, then appends the version itself.
func TestBulkCopyWaitsForAConcurrentRestoreKey(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	if err := apply.DeferKey(ctx, f.env.Target, acc, changebatch.Version{LSN: 400}); err != nil {
		t.Fatal(err)
	}
	other := pgtest.Connect(t, f.env.TargetURL)
	restoring, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer restoring.Rollback(ctx)
	if _, err := apply.RestoreKey(ctx, restoring, acc); err != nil {
		t.Fatal(err)
	}
	copied := make(chan error, 1)
	go func() {
		tx, err := f.ap.Begin(ctx)
		if err != nil {
			copied <- err
			return
		}
		defer tx.Rollback(ctx)
		_, _, _, err = tx.CopySnapshotRows(ctx, acc, changebatch.Version{LSN: 400}, 0, func(w io.Writer, _ bool) (int64, error) {
			_, err := io.WriteString(w, "1\tone\t10\n")
			return 1, err
		})
		if err == nil {
			err = tx.Commit(ctx)
		}
		copied <- err
	}()
	f.waitForALockOnAcc(t, "the copy waits for the ALTER TABLE's lock")
	if err := restoring.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-copied; err != nil {
		t.Fatalf("bulk copy during a concurrent RestoreKey: %v", err)
	}
	f.expect(t, "1|one|10|0/190#0|f|")
}

// Two processes that find a bulk load's key missing (the loader completing it, and a daemon or a
// backfill starting meanwhile) both restore it: the second waits for the first and then finds the
// key built, rather than failing on a second primary key.
func TestConcurrentRestoreKeysBuildOneKey(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	if err := apply.DeferKey(ctx, f.env.Target, acc, changebatch.Version{LSN: 400}); err != nil {
		t.Fatal(err)
	}
	first, err := pgtest.Connect(t, f.env.TargetURL).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(ctx)
	if built, err := apply.RestoreKey(ctx, first, acc); err != nil || !built {
		t.Fatalf("first RestoreKey = %v, %v; want built", built, err)
	}
	type outcome struct {
		built bool
		err   error
	}
	second := make(chan outcome, 1)
	go func() {
		var o outcome
		o.err = pgx.BeginFunc(ctx, f.env.Target, func(tx pgx.Tx) error {
			var err error
			o.built, err = apply.RestoreKey(ctx, tx, acc)
			return err
		})
		second <- o
	}()
	f.waitForALockOnAcc(t, "the second RestoreKey waits for the first")
	if err := first.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if o := <-second; o.err != nil || o.built {
		t.Fatalf("second RestoreKey = %v, %v; want the key found built by the first", o.built, o.err)
	}
}

// waitForALockOnAcc waits until one session waits for a lock on the target's acc table.
func (f fixture) waitForALockOnAcc(t *testing.T, what string) {
	t.Helper()
	watch := pgtest.Connect(t, f.env.TargetURL)
	pgtest.Eventually(t, 30*time.Second, what, func() (bool, string) {
		n := pgtest.Scalar[int64](t, watch, `select count(*) from pg_locks where relation = 'acc'::regclass and not granted`)
		return n == 1, fmt.Sprintf("%d lock requests waiting", n)
	})
}
