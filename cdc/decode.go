package cdc

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/jackc/pglogrepl"
)

// decode parses one pgoutput message. pglogrepl.Parse trusts its input: an empty message or a
// short field panics, and a length field allocates whatever it claims. decode first checks the
// length fields against the message (checkLengths) and turns any remaining panic into an error,
// so a malformed message from the wire stops the stream with an error instead of a crash.
func decode(raw []byte) (m pglogrepl.Message, err error) {
	if err := checkLengths(raw); err != nil {
		return nil, err
	}
	defer func() {
		if r := recover(); r != nil {
			m, err = nil, fmt.Errorf("malformed pgoutput message %q: %v", raw[0], r)
		}
	}()
	return pglogrepl.Parse(raw)
}

var errShort = errors.New("pgoutput message shorter than its length fields say")

// checkLengths verifies that the counts and lengths of Truncate, Insert, Update and Delete
// messages fit in the message (PostgreSQL docs §55.5 "Logical Replication Message Formats").
func checkLengths(raw []byte) error {
	if len(raw) == 0 {
		return errors.New("empty pgoutput message")
	}
	body := raw[1:]
	switch pglogrepl.MessageType(raw[0]) {
	case pglogrepl.MessageTypeTruncate:
		if len(body) < 5 || uint64(binary.BigEndian.Uint32(body))*4 > uint64(len(body)-5) {
			return errShort
		}
	case pglogrepl.MessageTypeInsert, pglogrepl.MessageTypeUpdate, pglogrepl.MessageTypeDelete:
		if len(body) < 4 {
			return errShort
		}
		rest := body[4:]
		for len(rest) > 0 {
			switch rest[0] {
			case 'K', 'O', 'N':
				n, err := tupleLen(rest[1:])
				if err != nil {
					return err
				}
				rest = rest[1+n:]
			default:
				return fmt.Errorf("pgoutput message %q: unknown tuple marker %q", raw[0], rest[0])
			}
		}
	}
	return nil
}

// tupleLen returns the length in bytes of the TupleData at the start of b.
func tupleLen(b []byte) (int, error) {
	if len(b) < 2 {
		return 0, errShort
	}
	cols, pos := int(binary.BigEndian.Uint16(b)), 2
	for i := 0; i < cols; i++ {
		if pos >= len(b) {
			return 0, errShort
		}
		kind := b[pos]
		pos++
		if kind == pglogrepl.TupleDataTypeText || kind == pglogrepl.TupleDataTypeBinary {
			if pos+4 > len(b) {
				return 0, errShort
			}
			n := uint64(binary.BigEndian.Uint32(b[pos:]))
			pos += 4
			if n > uint64(len(b)-pos) {
				return 0, errShort
			}
			pos += int(n)
		}
	}
	return pos, nil
}
