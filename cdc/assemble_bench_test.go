package cdc

import (
	"strconv"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// BenchmarkAssemble measures the stream's decoding and batch building per change, without a
// database: one transaction of 1,000 pgoutput messages (inserts, or updates and deletes of a
// 3-column table with a 100-byte text value) parsed (pglogrepl.Parse), handed to the assembler
// and taken as Arrow batches at its commit. It reports changes/s; -benchmem gives the
// allocations per transaction (divide by 1,000 for a change). Run with
// go test ./cdc -run '^$' -bench Assemble -benchmem.
func BenchmarkAssemble(b *testing.B) {
	const n = 1000
	body := strings.Repeat("x", 100)
	for _, kind := range []string{"insert", "update", "delete"} {
		b.Run(kind, func(b *testing.B) {
			msgs := [][]byte{msgBegin(0x500, 7), itemsRel}
			for i := range n {
				id := strconv.Itoa(i)
				switch kind {
				case "insert":
					msgs = append(msgs, msgInsert(16400, id, body, id))
				case "update":
					msgs = append(msgs, msgUpdate(16400, nil, id, body, id))
				case "delete":
					msgs = append(msgs, msgDelete(16400, id, nil, nil))
				}
			}
			msgs = append(msgs, msgCommit(0x500, 0x530))
			mem := memory.NewGoAllocator()
			b.ReportAllocs()
			for b.Loop() {
				a := newAssembler(mem, []changebatch.Table{items}, 0, map[uint32]pglogrepl.LSN{})
				for _, raw := range msgs {
					m, err := pglogrepl.Parse(raw)
					if err != nil {
						b.Fatal(err)
					}
					if _, err := a.handle(m); err != nil {
						b.Fatal(err)
					}
				}
				batches, _ := a.take()
				for _, rec := range batches {
					rec.Release()
				}
				a.release()
			}
			b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "changes/s")
		})
	}
}
