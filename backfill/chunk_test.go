package backfill

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// tables describes the test tables as a producer would (key columns with their index positions).
var tables = map[string]changebatch.Table{
	"words":  {TableName: changebatch.TableName{Schema: "public", Name: "words"}, Columns: []changebatch.Column{{Name: "w", Type: "text", Key: true, KeyPos: 1}, {Name: "n", Type: "integer"}}},
	"cwords": {TableName: changebatch.TableName{Schema: "public", Name: "cwords"}, Columns: []changebatch.Column{{Name: "w", Type: "text", Key: true, KeyPos: 1}, {Name: "n", Type: "integer"}}},
	"pairs":  {TableName: changebatch.TableName{Schema: "public", Name: "pairs"}, Columns: []changebatch.Column{{Name: "a", Type: "integer", Key: true, KeyPos: 2}, {Name: "b", Type: "text", Key: true, KeyPos: 1}}},
	"empty":  {TableName: changebatch.TableName{Schema: "public", Name: "empty"}, Columns: []changebatch.Column{{Name: "id", Type: "integer", Key: true, KeyPos: 1}}},
	"one":    {TableName: changebatch.TableName{Schema: "public", Name: "one"}, Columns: []changebatch.Column{{Name: "id", Type: "integer", Key: true, KeyPos: 1}, {Name: "v", Type: "text"}}},
	"ints":   {TableName: changebatch.TableName{Schema: "public", Name: "ints"}, Columns: []changebatch.Column{{Name: "id", Type: "bigint", Key: true, KeyPos: 1}}},
	"seq":    {TableName: changebatch.TableName{Schema: "public", Name: "seq"}, Columns: []changebatch.Column{{Name: "id", Type: "integer", Key: true, KeyPos: 1}}},
}

// readPlan plans table name in a fresh snapshot with chunkRows rows per chunk, reads every chunk
// and returns the chunks and, per chunk, the first column of its rows in the order read.
func readPlan(t *testing.T, env *pgtest.Env, name string, chunkRows int) ([]Chunk, [][]string) {
	t.Helper()
	ctx := context.Background()
	tab := tables[name]
	exp, err := Export(ctx, env.SourceURL, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer exp.Close(ctx)
	planConn := pgtest.Connect(t, env.SourceURL)
	p, err := NewPlanner(planConn, exp.Snapshot, tab, chunkRows, nil)
	if err != nil {
		t.Fatal(err)
	}
	chunks := allChunks(t, p)
	var rows [][]string
	for _, c := range chunks {
		var got []string
		n, err := ReadChunk(ctx, env.Source, exp.Snapshot, tab, c, 2, func(_ context.Context, rec arrow.RecordBatch) error {
			v, err := changebatch.NewView(rec)
			if err != nil {
				return err
			}
			for i := 0; i < v.Len(); i++ {
				if v.Version(i) != (changebatch.Version{LSN: exp.LSN}) || v.Op(i) != changebatch.OpUpsert {
					t.Errorf("row %d of chunk %s: op %d at %v, want an upsert at (%s, 0)", i, c, v.Op(i), v.Version(i), exp.LSN)
				}
				got = append(got, v.Value(i, 0).Text)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if int(n) != len(got) {
			t.Errorf("chunk %s: ReadChunk returned %d rows, emitted %d", c, n, len(got))
		}
		rows = append(rows, got)
	}
	return chunks, rows
}

// allChunks returns every chunk p plans.
func allChunks(t *testing.T, p *Planner) []Chunk {
	t.Helper()
	var chunks []Chunk
	for {
		c, ok, err := p.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			return chunks
		}
		chunks = append(chunks, c)
	}
}

func joined(rows [][]string) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = strings.Join(r, " ")
	}
	return out
}

// Text keys are chunked and read in the key's collation order, never Go's byte order: under "C"
// upper case sorts first, under ICU's root collation lower case comes first and 'a' before 'B'.
func TestChunksFollowTheKeyCollation(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source,
		`create table words (w text collate "und-x-icu" primary key, n int)`,
		`insert into words values ('b', 1), ('B', 2), ('a', 3), ('A', 4), ('c', 5)`,
		`create table cwords (w text collate "C" primary key, n int)`,
		`insert into cwords select * from words`)
	_, rows := readPlan(t, env, "words", 2)
	if d := pgtest.Diff([]string{"a A", "b B", "c"}, joined(rows)); d != "" {
		t.Errorf("ICU chunks: %s", d)
	}
	_, rows = readPlan(t, env, "cwords", 2)
	if d := pgtest.Diff([]string{"A B", "a b", "c"}, joined(rows)); d != "" {
		t.Errorf("C chunks: %s", d)
	}
}

// A composite key in index order (b, a) that differs from column order, with chunk boundaries
// inside a run of equal first key columns; the last chunk is unbounded and takes the rest.
func TestChunksOfACompositeKey(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source,
		`create table pairs (a int, b text, primary key (b, a))`,
		`insert into pairs values (2, 'x'), (1, 'x'), (3, 'x'), (1, 'y'), (9, 'a')`)
	chunks, rows := readPlan(t, env, "pairs", 2)
	if d := pgtest.Diff([]string{"9 1", "2 3", "1"}, joined(rows)); d != "" {
		t.Errorf("chunks: %s", d)
	}
	if got := chunks[1].String(); got != "((x, 1), (x, 3)]" {
		t.Errorf("second chunk = %s, want ((x, 1), (x, 3)]", got)
	}
}

// Integer keys are planned in numeric order (the 10th key is 10, not "10" after "1" in text
// order), so every chunk but the last has exactly the chunk size.
func TestChunksHaveTheChunkSize(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table ints (id bigint primary key)`, `insert into ints select generate_series(1, 25)`)
	chunks, rows := readPlan(t, env, "ints", 10)
	var sizes []string
	for i, r := range rows {
		sizes = append(sizes, chunks[i].String()+" "+strconv.Itoa(len(r)))
	}
	if d := pgtest.Diff([]string{"(-inf, 10] 10", "(10, 20] 10", "(20, +inf] 5"}, sizes); d != "" {
		t.Errorf("chunks: %s", d)
	}
}

// An empty table is one unbounded chunk with no rows; a table of one row is that row in the first
// chunk and an empty unbounded last chunk when the chunk size is one row.
func TestChunksOfEmptyAndOneRowTables(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source,
		`create table empty (id int primary key)`,
		`create table one (id int primary key, v text)`,
		`insert into one values (7, null)`)
	chunks, rows := readPlan(t, env, "empty", 10)
	if len(chunks) != 1 || chunks[0].Lower != nil || chunks[0].Upper != nil || len(rows[0]) != 0 {
		t.Errorf("empty table: chunks %v rows %v, want one unbounded chunk without rows", chunks, rows)
	}
	chunks, rows = readPlan(t, env, "one", 1)
	if d := pgtest.Diff([]string{"7", ""}, joined(rows)); d != "" || chunks[1].Upper != nil {
		t.Errorf("one row: chunks %v: %s", chunks, d)
	}
}

// Rows committed after the snapshot was exported are not read, whichever chunk they fall in.
func TestChunksReadTheSnapshotOnly(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table seq (id int primary key)`,
		`insert into seq select generate_series(1, 10)`)
	ctx := context.Background()
	tab := tables["seq"]
	exp, err := Export(ctx, env.SourceURL, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer exp.Close(ctx)
	pgtest.Exec(t, env.Source, `insert into seq values (0), (5000)`, `delete from seq where id = 5`)
	var n int64
	for _, c := range []Chunk{{Upper: []string{"5"}}, {Lower: []string{"5"}}} {
		got, err := ReadChunk(ctx, env.Source, exp.Snapshot, tab, c, 100, func(context.Context, arrow.RecordBatch) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		n += got
	}
	if n != 10 {
		t.Errorf("read %d rows, want the 10 of the snapshot", n)
	}
}

// A table whose columns changed after it was described (ADD COLUMN with a constant default
// rewrites nothing) is not read with the old description: the rows would lack the column.
func TestReadStopsWhenTheColumnsChanged(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table one (id int primary key, v text)`, `insert into one values (1, 'a')`,
		`alter table one add column c int default 7`)
	ctx := context.Background()
	exp, err := Export(ctx, env.SourceURL, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer exp.Close(ctx)
	_, err = ReadChunk(ctx, env.Source, exp.Snapshot, tables["one"], Chunk{}, 100, func(context.Context, arrow.RecordBatch) error { return nil })
	if !errors.Is(err, ErrRewritten) {
		t.Fatalf("err = %v, want ErrRewritten", err)
	}
}
