package cdc

import (
	"encoding/binary"
	"testing"

	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/jackc/pglogrepl"
	"github.com/pgconverge/pgconverge/apply/changebatch"
)

// frame joins messages as [u16 length][message]... for the fuzzer's single byte input.
func frame(msgs ...[]byte) []byte {
	var out []byte
	for _, m := range msgs {
		out = binary.BigEndian.AppendUint16(out, uint16(len(m)))
		out = append(out, m...)
	}
	return out
}

// FuzzAssemble feeds arbitrary pgoutput message sequences to the decoder and the assembler. It
// never panics, and every row it emits carries the commit LSN of an open transaction's Begin and
// an ordinal ≥ 1, and the group's end is 0 or the end LSN of a Commit it saw.
func FuzzAssemble(f *testing.F) {
	f.Add(frame(msgBegin(0x500, 7), itemsRel, msgInsert(16400, "1", "a", "10"), msgUpdate(16400, []any{"1", nil, nil}, "2", toast, nil),
		msgDelete(16400, "2", nil, nil), msgTruncate(16400), msgCommit(0x500, 0x530)))
	f.Add(frame(msgBegin(0x10, 1), itemsRel, msgInsert(16400, "1", "a", "1"), msgCommit(0x10, 0x20),
		msgBegin(0x30, 2), msgUpdate(16400, nil, "1", toast, "2")))
	f.Fuzz(func(t *testing.T, data []byte) {
		a := newAssembler(memory.NewGoAllocator(), []changebatch.Table{items}, 0, nil)
		defer a.release()
		begins := map[pglogrepl.LSN]bool{}
		ends := map[pglogrepl.LSN]bool{0: true}
		for len(data) >= 2 {
			n := int(binary.BigEndian.Uint16(data))
			data = data[2:]
			if n > len(data) {
				n = len(data)
			}
			raw := data[:n]
			data = data[n:]
			m, err := decode(raw)
			if err != nil {
				continue
			}
			switch m := m.(type) {
			case *pglogrepl.BeginMessage:
				begins[m.FinalLSN] = true
			case *pglogrepl.CommitMessage:
				ends[m.TransactionEndLSN] = true
			}
			if _, err := a.handle(m); err != nil {
				return
			}
		}
		batches, end := a.take()
		if !ends[end] {
			t.Errorf("group end %s is no Commit's end LSN", end)
		}
		for _, rec := range batches {
			v, err := changebatch.NewView(rec)
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < v.Len(); i++ {
				if ver := v.Version(i); !begins[ver.LSN] || ver.Seq == 0 {
					t.Errorf("row %d has version %s: not a Begin's final LSN with an ordinal", i, ver)
				}
			}
			rec.Release()
		}
	})
}
