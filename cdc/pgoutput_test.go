package cdc

import (
	"encoding/binary"

	"github.com/jackc/pglogrepl"
)

// The helpers below encode pgoutput protocol-1 messages byte by byte as PostgreSQL sends them
// (PostgreSQL docs §55.5 "Logical Replication Message Formats"), so tests exercise decoding too.

type enc []byte

func (e enc) u8(v byte) enc    { return append(e, v) }
func (e enc) u16(v uint16) enc { return binary.BigEndian.AppendUint16(e, v) }
func (e enc) u32(v uint32) enc { return binary.BigEndian.AppendUint32(e, v) }
func (e enc) u64(v uint64) enc { return binary.BigEndian.AppendUint64(e, v) }
func (e enc) str(s string) enc { return append(append(e, s...), 0) }

func msgBegin(final pglogrepl.LSN, xid uint32) []byte {
	return enc{'B'}.u64(uint64(final)).u64(0).u32(xid)
}

func msgCommit(commit, end pglogrepl.LSN) []byte {
	return enc{'C'}.u8(0).u64(uint64(commit)).u64(uint64(end)).u64(0)
}

type relCol struct {
	name string
	key  bool
}

func msgRelation(id uint32, schema, name string, cols ...relCol) []byte {
	e := enc{'R'}.u32(id).str(schema).str(name).u8('d').u16(uint16(len(cols)))
	for _, c := range cols {
		flags := byte(0)
		if c.key {
			flags = 1
		}
		e = e.u8(flags).str(c.name).u32(25).u32(0xFFFFFFFF)
	}
	return e
}

// tuple values: a string is text, nil is NULL, toast is an unchanged TOASTed value.
type toastValue struct{}

var toast = toastValue{}

func tuple(e enc, vals ...any) enc {
	e = e.u16(uint16(len(vals)))
	for _, v := range vals {
		switch v := v.(type) {
		case nil:
			e = e.u8('n')
		case toastValue:
			e = e.u8('u')
		case string:
			e = append(e.u8('t').u32(uint32(len(v))), v...)
		}
	}
	return e
}

func msgInsert(rel uint32, vals ...any) []byte {
	return tuple(enc{'I'}.u32(rel).u8('N'), vals...)
}

func msgUpdate(rel uint32, oldKey []any, vals ...any) []byte {
	e := enc{'U'}.u32(rel)
	if oldKey != nil {
		e = tuple(e.u8('K'), oldKey...)
	}
	return tuple(e.u8('N'), vals...)
}

func msgDelete(rel uint32, key ...any) []byte {
	return tuple(enc{'D'}.u32(rel).u8('K'), key...)
}

func msgTruncate(rels ...uint32) []byte {
	e := enc{'T'}.u32(uint32(len(rels))).u8(0)
	for _, r := range rels {
		e = e.u32(r)
	}
	return e
}
