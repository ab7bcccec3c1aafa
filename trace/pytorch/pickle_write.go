// This file holds a minimal pickle encoder for plain data, used to write
// PyTorch-format memory snapshots.

package pytorch

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
)

// pdict is a Python dict with its keys in a fixed order.
type pdict []pkv

type pkv struct {
	k string
	v any
}

// ptuple is a Python tuple.
type ptuple []any

// pickleEncoder writes plain data (None, bool, int, float, str, list,
// tuple, dict with string keys) as a protocol-2 pickle: the opcodes that
// any Python 3 unpickler, and this package's own reader, accept.
type pickleEncoder struct {
	buf []byte
}

func encodePickle(v any) ([]byte, error) {
	e := &pickleEncoder{buf: []byte{0x80, 2}} // PROTO 2
	if err := e.value(v); err != nil {
		return nil, err
	}
	e.buf = append(e.buf, '.') // STOP
	return e.buf, nil
}

const pickleBatch = 1000 // items per APPENDS/SETITEMS, as Python batches them

func (e *pickleEncoder) value(v any) error {
	switch x := v.(type) {
	case nil:
		e.buf = append(e.buf, 'N')
	case bool:
		if x {
			e.buf = append(e.buf, 0x88)
		} else {
			e.buf = append(e.buf, 0x89)
		}
	case int:
		e.int(int64(x))
	case int64:
		e.int(x)
	case uint64:
		if x <= math.MaxInt64 {
			e.int(int64(x))
		} else {
			e.long(x, false)
		}
	case float64:
		e.buf = append(e.buf, 'G')
		e.buf = binary.BigEndian.AppendUint64(e.buf, math.Float64bits(x))
	case string:
		e.buf = append(e.buf, 'X')
		e.buf = binary.LittleEndian.AppendUint32(e.buf, uint32(len(x)))
		e.buf = append(e.buf, x...)
	case []any:
		e.buf = append(e.buf, ']')
		for chunk := range slices.Chunk(x, pickleBatch) {
			e.buf = append(e.buf, '(')
			for _, item := range chunk {
				if err := e.value(item); err != nil {
					return err
				}
			}
			e.buf = append(e.buf, 'e') // APPENDS
		}
	case ptuple:
		e.buf = append(e.buf, '(')
		for _, item := range x {
			if err := e.value(item); err != nil {
				return err
			}
		}
		e.buf = append(e.buf, 't')
	case pdict:
		e.buf = append(e.buf, '}')
		for chunk := range slices.Chunk(x, pickleBatch) {
			e.buf = append(e.buf, '(')
			for _, kv := range chunk {
				if err := e.value(kv.k); err != nil {
					return err
				}
				if err := e.value(kv.v); err != nil {
					return err
				}
			}
			e.buf = append(e.buf, 'u') // SETITEMS
		}
	default:
		return fmt.Errorf("pickle: cannot encode %T", v)
	}
	return nil
}

// int writes a signed integer: BININT when it fits 32 bits, else LONG1.
func (e *pickleEncoder) int(x int64) {
	if x >= math.MinInt32 && x <= math.MaxInt32 {
		e.buf = append(e.buf, 'J')
		e.buf = binary.LittleEndian.AppendUint32(e.buf, uint32(int32(x)))
		return
	}
	e.long(uint64(x), x < 0)
}

// long writes LONG1: a little-endian two's-complement integer of as few
// bytes as hold it with its sign bit.
func (e *pickleEncoder) long(u uint64, negative bool) {
	var b [9]byte
	binary.LittleEndian.PutUint64(b[:8], u)
	if negative {
		b[8] = 0xff
	}
	n := 9
	for n > 1 {
		top, next := b[n-1], b[n-2]
		if (!negative && top == 0 && next < 0x80) || (negative && top == 0xff && next >= 0x80) {
			n--
			continue
		}
		break
	}
	e.buf = append(e.buf, 0x8a, byte(n))
	e.buf = append(e.buf, b[:n]...)
}
