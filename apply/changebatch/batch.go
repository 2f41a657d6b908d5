package changebatch

import (
	"fmt"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// Metadata keys of a batch schema and its fields.
const (
	metaSchema = "pgconverge.schema"
	metaTable  = "pgconverge.table"
	metaType   = "pgconverge.type"
	metaKey    = "pgconverge.key"
	// metaKeyless is "true" on the schema of a keyless table's batches (Table.Keyless).
	metaKeyless = "pgconverge.keyless"
)

// Schema returns the Arrow schema of change batches for table t (see the package doc for its shape).
func Schema(t Table) *arrow.Schema {
	fields := make([]arrow.Field, 0, len(t.Columns)+4)
	for _, c := range t.Columns {
		key := "false"
		if c.Key {
			key = "true"
		}
		fields = append(fields, arrow.Field{
			Name: c.Name, Type: arrow.BinaryTypes.String, Nullable: true,
			Metadata: arrow.NewMetadata([]string{metaType, metaKey}, []string{c.Type, key}),
		})
	}
	fields = append(fields,
		arrow.Field{Name: ColLSN, Type: arrow.PrimitiveTypes.Uint64},
		arrow.Field{Name: ColSeq, Type: arrow.PrimitiveTypes.Uint64},
		arrow.Field{Name: ColOp, Type: arrow.PrimitiveTypes.Uint8},
		arrow.Field{Name: ColUnchanged, Type: arrow.ListOf(arrow.BinaryTypes.String), Nullable: true},
	)
	if t.Keyless {
		fields = append(fields, arrow.Field{Name: ColOccurrence, Type: arrow.PrimitiveTypes.Uint64})
	}
	keys, vals := []string{metaSchema, metaTable}, []string{t.Schema, t.Name}
	if t.Keyless {
		keys, vals = append(keys, metaKeyless), append(vals, "true")
	}
	md := arrow.NewMetadata(keys, vals)
	return arrow.NewSchema(fields, &md)
}

// TableOf recovers the table description from a batch schema made by Schema. It returns an error
// when the schema lacks the metadata or the trailing version columns.
func TableOf(s *arrow.Schema) (Table, error) {
	md := s.Metadata()
	si, ti := md.FindKey(metaSchema), md.FindKey(metaTable)
	keyless := false
	if k := md.FindKey(metaKeyless); k >= 0 {
		keyless = md.Values()[k] == "true"
	}
	n := s.NumFields() - 4
	if keyless {
		n--
	}
	if si < 0 || ti < 0 || n < 0 || s.Field(n).Name != ColLSN {
		return Table{}, fmt.Errorf("schema is not a change batch schema: %s", s)
	}
	t := Table{TableName: TableName{Schema: md.Values()[si], Name: md.Values()[ti]}, Keyless: keyless}
	for i := 0; i < n; i++ {
		f := s.Field(i)
		c := Column{Name: f.Name}
		if k := f.Metadata.FindKey(metaType); k >= 0 {
			c.Type = f.Metadata.Values()[k]
		}
		if k := f.Metadata.FindKey(metaKey); k >= 0 {
			c.Key = f.Metadata.Values()[k] == "true"
		}
		t.Columns = append(t.Columns, c)
	}
	return t, nil
}

// Builder accumulates changes of one table into Arrow batches. It is not safe for concurrent use.
type Builder struct {
	table     Table
	rb        *array.RecordBuilder
	data      []*array.StringBuilder
	lsn, seq  *array.Uint64Builder
	op        *array.Uint8Builder
	unchanged *array.ListBuilder
	names     *array.StringBuilder
	occ       *array.Uint64Builder // keyless tables only
	rows      int
	bytes     int
}

// NewBuilder returns a builder for batches of table t. Release it when done.
func NewBuilder(mem memory.Allocator, t Table) *Builder {
	rb := array.NewRecordBuilder(mem, Schema(t))
	b := &Builder{table: t, rb: rb}
	n := len(t.Columns)
	for i := 0; i < n; i++ {
		b.data = append(b.data, rb.Field(i).(*array.StringBuilder))
	}
	b.lsn = rb.Field(n).(*array.Uint64Builder)
	b.seq = rb.Field(n + 1).(*array.Uint64Builder)
	b.op = rb.Field(n + 2).(*array.Uint8Builder)
	b.unchanged = rb.Field(n + 3).(*array.ListBuilder)
	b.names = b.unchanged.ValueBuilder().(*array.StringBuilder)
	if t.Keyless {
		b.occ = rb.Field(n + 4).(*array.Uint64Builder)
	}
	return b
}

// Append adds one change. It panics if len(c.Values) differs from the table's column count, which
// is a producer bug.
func (b *Builder) Append(c Change) {
	if len(c.Values) != len(b.data) {
		panic(fmt.Sprintf("changebatch: %d values for %d columns of %s", len(c.Values), len(b.data), b.table))
	}
	var unchanged []string
	for i, v := range c.Values {
		switch {
		case v.Unchanged:
			b.data[i].AppendNull()
			unchanged = append(unchanged, b.table.Columns[i].Name)
		case v.Null:
			b.data[i].AppendNull()
		default:
			b.data[i].Append(v.Text)
			b.bytes += len(v.Text)
		}
	}
	b.lsn.Append(uint64(c.Version.LSN))
	b.seq.Append(c.Version.Seq)
	b.op.Append(uint8(c.Op))
	if b.occ != nil {
		b.occ.Append(c.Occurrence)
	}
	if unchanged == nil {
		b.unchanged.AppendNull()
	} else {
		b.unchanged.Append(true)
		for _, name := range unchanged {
			b.names.Append(name)
		}
	}
	b.rows++
	b.bytes += b.rowOverhead()
}

// AppendSnapshotRow adds an upsert at version ver whose values are the column texts as the server
// sent them (nil for NULL), without converting them to strings first: a snapshot reader's fast
// path. It panics if len(raw) differs from the table's column count, or if the table is keyless
// (AppendSnapshotOccurrence).
func (b *Builder) AppendSnapshotRow(ver Version, raw [][]byte) {
	if b.occ != nil {
		panic(fmt.Sprintf("changebatch: snapshot row of keyless table %s without its occurrence", b.table))
	}
	b.appendSnapshot(ver, raw)
}

// AppendSnapshotOccurrence is AppendSnapshotRow for a keyless table (Table.Keyless): occ
// identifies the row among the snapshot's rows (Change.Occurrence). It panics if the table is not
// keyless.
func (b *Builder) AppendSnapshotOccurrence(ver Version, occ uint64, raw [][]byte) {
	if b.occ == nil {
		panic(fmt.Sprintf("changebatch: occurrence for %s, which has a key", b.table))
	}
	b.occ.Append(occ)
	b.appendSnapshot(ver, raw)
}

func (b *Builder) appendSnapshot(ver Version, raw [][]byte) {
	if len(raw) != len(b.data) {
		panic(fmt.Sprintf("changebatch: %d values for %d columns of %s", len(raw), len(b.data), b.table))
	}
	for i, v := range raw {
		if v == nil {
			b.data[i].AppendNull()
			continue
		}
		b.data[i].BinaryBuilder.Append(v)
		b.bytes += len(v)
	}
	b.lsn.Append(uint64(ver.LSN))
	b.seq.Append(ver.Seq)
	b.op.Append(uint8(OpUpsert))
	b.unchanged.AppendNull()
	b.rows++
	b.bytes += b.rowOverhead()
}

// Rows returns the number of changes appended since the last NewBatch.
func (b *Builder) Rows() int { return b.rows }

// rowOverhead is what a row takes besides its values, in bytes: version (16), operation,
// occurrence and unchanged list (about 16) and an offset per data column (4).
func (b *Builder) rowOverhead() int { return 32 + 4*len(b.data) }

// Bytes returns the approximate size in bytes of the rows appended since the last NewBatch: their
// values and each row's overhead (rowOverhead).
func (b *Builder) Bytes() int { return b.bytes }

// NewBatch returns the accumulated changes as a record batch and resets the builder. The caller
// owns the batch and must Release it; a consumer that keeps it must Retain it.
func (b *Builder) NewBatch() arrow.RecordBatch {
	rows := b.rows
	dataLen := make([]int, len(b.data))
	for i, d := range b.data {
		dataLen[i] = d.DataLen()
	}
	b.rows, b.bytes = 0, 0
	rec := b.rb.NewRecordBatch()
	// The next batch is likely shaped like this one: reserving its size up front saves growing the
	// buffers by doubling, which copies them each time.
	if rows > 0 {
		b.rb.Reserve(rows)
		for i, d := range b.data {
			d.ReserveData(dataLen[i])
		}
	}
	return rec
}

// Release frees the builder's buffers.
func (b *Builder) Release() { b.rb.Release() }
