package backfill

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/pgconverge/pgconverge/apply/changebatch"
	"github.com/pgconverge/pgconverge/internal/pgtest"
)

// A block plan cuts a table into block ranges of about the chunk size, the last one unbounded;
// inside one snapshot its chunks hold every row the snapshot shows exactly once, by ReadChunk and
// by CopyChunk (text and binary), while rows are updated (their new versions stored in other
// blocks), deleted and inserted after the snapshot. A plan resumed after a chunk goes on from its
// upper block.
func TestBlockPlanReadsEveryRowOnce(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	pgtest.Exec(t, env.Source, `create table ints (id bigint primary key)`,
		`insert into ints select generate_series(1, 5000)`, `analyze ints`)
	ctx := context.Background()
	tab := tables["ints"]
	if !BlockPlanOK(env.Source, tab) {
		t.Fatal("BlockPlanOK = false for a plain keyed table on PostgreSQL 14 or later")
	}
	exp, err := Export(ctx, env.SourceURL, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer exp.Close(ctx)
	pgtest.Exec(t, env.Source, `update ints set id = id + 100000 where id % 7 = 0`, `delete from ints where id % 11 = 0`,
		`insert into ints select generate_series(200001, 201000)`)
	p, err := NewBlockPlanner(ctx, pgtest.Connect(t, env.SourceURL), exp.Snapshot, tab, 1000, nil)
	if err != nil {
		t.Fatal(err)
	}
	chunks := allChunks(t, p)
	// 5,000 rows of about 226 per block (analyzed): chunks of 4 blocks, the file's size (with the
	// blocks written after the snapshot) cut into adjacent ranges, the last unbounded.
	n := len(chunks)
	if n < 5 || chunks[0].String() != "blocks [0, 4)" || chunks[n-1].Upper != nil {
		t.Fatalf("chunks = %v, want at least 5 from blocks [0, 4), the last unbounded", chunks)
	}
	for i := 1; i < n; i++ {
		if !slices.Equal(chunks[i].Lower, chunks[i-1].Upper) {
			t.Fatalf("chunks = %v: not adjacent", chunks)
		}
	}
	var read, copied, binary []int
	for _, c := range chunks {
		n, err := ReadChunk(ctx, env.Source, exp.Snapshot, tab, c, 300, func(_ context.Context, rec arrow.RecordBatch) error {
			v, err := changebatch.NewView(rec)
			if err != nil {
				return err
			}
			for i := 0; i < v.Len(); i++ {
				id, _ := strconv.Atoi(v.Value(i, 0).Text)
				read = append(read, id)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		var text bytes.Buffer
		m, err := CopyChunk(ctx, env.Source, exp.Snapshot, tab, c, false, &text)
		if err != nil || m != n {
			t.Fatalf("copy chunk %s: %d rows, %v; ReadChunk read %d", c, m, err, n)
		}
		for _, l := range strings.Fields(text.String()) {
			id, _ := strconv.Atoi(l)
			copied = append(copied, id)
		}
		var bin bytes.Buffer
		if m, err := CopyChunk(ctx, env.Source, exp.Snapshot, tab, c, true, &bin); err != nil || m != n {
			t.Fatalf("binary copy of chunk %s: %d rows, %v; ReadChunk read %d", c, m, err, n)
		}
		binary = append(binary, binaryInt8s(t, bin.Bytes())...)
	}
	want := make([]int, 5000)
	for i := range want {
		want[i] = i + 1
	}
	for name, got := range map[string][]int{"ReadChunk": read, "CopyChunk": copied, "binary CopyChunk": binary} {
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s read %d rows, want ids 1..5000 once each (the snapshot's)", name, len(got))
		}
	}

	resumed, err := NewBlockPlanner(ctx, pgtest.Connect(t, env.SourceURL), exp.Snapshot, tab, 1000, chunks[0].Upper)
	if err != nil {
		t.Fatal(err)
	}
	if c, _, err := resumed.Next(ctx); err != nil || c.String() != chunks[1].String() {
		t.Errorf("resumed plan's first chunk = %s (%v), want %s", c, err, chunks[1])
	}
	if resumed.SourceFile() == 0 || resumed.SourceFile() != p.SourceFile() {
		t.Errorf("source file %d, first plan's %d: want the same, not 0", resumed.SourceFile(), p.SourceFile())
	}
}

// binaryInt8s returns the bigint of each row of a COPY binary stream of one bigint column.
func binaryInt8s(t *testing.T, b []byte) []int {
	t.Helper()
	const header = 11 + 4 + 4 // signature, flags, extension length
	if len(b) < header+2 {
		t.Fatalf("binary COPY output of %d bytes: no header", len(b))
	}
	var out []int
	for b = b[header:]; ; {
		fields := int16(uint16(b[0])<<8 | uint16(b[1]))
		if fields == -1 {
			return out
		}
		if fields != 1 || len(b) < 2+4+8 {
			t.Fatalf("binary COPY row with %d fields", fields)
		}
		var v uint64
		for _, c := range b[6:14] {
			v = v<<8 | uint64(c)
		}
		out = append(out, int(v))
		b = b[14:]
	}
}

// Only a plain keyed table read without a row filter can be cut by blocks, and a block chunk's
// bounds must be block numbers.
func TestBlockPlanRefusals(t *testing.T) {
	t.Parallel()
	env := pgtest.New(t)
	tab := tables["ints"]
	for name, c := range map[string]changebatch.Table{
		"partitioned": {TableName: tab.TableName, Columns: tab.Columns, Partitioned: true},
		"row filter":  {TableName: tab.TableName, Columns: tab.Columns, RowFilter: "id > 0"},
		"keyless":     {TableName: tab.TableName, Columns: []changebatch.Column{{Name: "id", Type: "bigint"}}, Keyless: true},
	} {
		if BlockPlanOK(env.Source, c) {
			t.Errorf("%s table: BlockPlanOK = true", name)
		}
	}
	for _, c := range []Chunk{{ByBlock: true}, {ByBlock: true, Lower: []string{"x"}}, {ByBlock: true, Lower: []string{"1"}, Upper: []string{"-2"}}} {
		if err := checkBounds(tab, c); err == nil {
			t.Errorf("checkBounds(%#v) = nil, want an error", c)
		}
	}
	_, err := NewBlockPlanner(context.Background(), env.Source, Snapshot{}, tab, 0, nil)
	if err == nil || errors.Is(err, ErrRewritten) {
		t.Errorf("chunk size 0: %v, want a refusal", err)
	}
}
