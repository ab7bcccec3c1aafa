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

// pshared is a value written once: every later use of the same *pshared
// refers back to it through the memo, so that the unpickled data holds one
// object in several places (as PyTorch's snapshots share their frames).
// Only values nobody mutates should be shared: a stack's frame list, a
// frame.
type pshared struct {
	v any
}

// Pickle opcodes the encoder writes: protocol 4's, and only those that
// Python's unpickler, this package's reader and PyTorch's memory
// visualizer (which has an unpickler of its own, of a few opcodes) all
// read.
const (
	opMark           = '('
	opStop           = '.'
	opNone           = 'N'
	opNewTrue        = 0x88
	opNewFalse       = 0x89
	opBinInt         = 'J'
	opBinInt1        = 'K'
	opBinInt2        = 'M'
	opLong1          = 0x8a
	opBinFloat       = 'G'
	opShortUnicode   = 0x8c
	opBinUnicode     = 'X'
	opEmptyList      = ']'
	opAppend         = 'a'
	opAppends        = 'e'
	opEmptyDict      = '}'
	opSetItem        = 's'
	opSetItems       = 'u'
	opEmptyTuple     = ')'
	opTuple1         = 0x85
	opTuple2         = 0x86
	opTuple3         = 0x87
	opTuple          = 't'
	opMemoize        = 0x94
	opBinGet         = 'h'
	opLongBinGet     = 'j'
	opProto          = 0x80
	opFrame          = 0x95
	frameHeaderSize  = 9        // FRAME and its 8-byte length
	frameSizeTarget  = 64 << 10 // a frame ends at the first opcode boundary past this
	frameSizeMin     = 4        // a shorter frame is written without its header
	minMemoStringLen = 4        // shorter strings cost no more written out than fetched
)

// pickleEncoder writes plain data (None, bool, int, float, str, list,
// tuple, dict with string keys) as a protocol-4 pickle, as Python's
// pickle.dump writes it (and so torch.cuda.memory._dump_snapshot): framed
// in 64 KiB frames, with the smallest integer and string opcodes, and with
// the memo: a string of four bytes or more is written once and memoized
// (MEMOIZE), and fetched (BINGET, LONG_BINGET) each later time, so that a
// snapshot's keys, actions, states, file and function names cost a few
// bytes each after the first. Python memoizes every object; this encoder
// memoizes only what can repeat (strings and pshared values), which keeps
// the memo small and its indices short.
type pickleEncoder struct {
	buf        []byte
	frameStart int // where the current frame's header is
	strings    map[string]uint32
	shared     map[*pshared]uint32
	memoLen    uint32 // the next MEMOIZE's index
}

func encodePickle(v any) ([]byte, error) {
	e := &pickleEncoder{
		buf:     []byte{opProto, 4},
		strings: make(map[string]uint32),
		shared:  make(map[*pshared]uint32),
	}
	e.startFrame()
	if err := e.value(v); err != nil {
		return nil, err
	}
	e.buf = append(e.buf, opStop)
	e.commitFrame()
	return e.buf, nil
}

// startFrame reserves a frame header; commitFrame fills it in, or removes
// it when the frame is too short to be worth one.
func (e *pickleEncoder) startFrame() {
	e.frameStart = len(e.buf)
	e.buf = append(e.buf, make([]byte, frameHeaderSize)...)
}

func (e *pickleEncoder) commitFrame() {
	n := len(e.buf) - e.frameStart - frameHeaderSize
	if n >= frameSizeMin {
		e.buf[e.frameStart] = opFrame
		binary.LittleEndian.PutUint64(e.buf[e.frameStart+1:], uint64(n))
		return
	}
	copy(e.buf[e.frameStart:], e.buf[e.frameStart+frameHeaderSize:])
	e.buf = e.buf[:len(e.buf)-frameHeaderSize]
}

// boundary is called between opcodes: it ends the frame once it is full.
func (e *pickleEncoder) boundary() {
	if len(e.buf)-e.frameStart-frameHeaderSize >= frameSizeTarget {
		e.commitFrame()
		e.startFrame()
	}
}

const pickleBatch = 1000 // items per APPENDS/SETITEMS, as Python batches them

func (e *pickleEncoder) value(v any) error {
	switch x := v.(type) {
	case nil:
		e.buf = append(e.buf, opNone)
	case bool:
		if x {
			e.buf = append(e.buf, opNewTrue)
		} else {
			e.buf = append(e.buf, opNewFalse)
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
		e.buf = append(e.buf, opBinFloat)
		e.buf = binary.BigEndian.AppendUint64(e.buf, math.Float64bits(x))
	case string:
		e.string(x)
	case []any:
		e.buf = append(e.buf, opEmptyList)
		if len(x) == 1 {
			if err := e.value(x[0]); err != nil {
				return err
			}
			e.buf = append(e.buf, opAppend)
			break
		}
		for chunk := range slices.Chunk(x, pickleBatch) {
			e.buf = append(e.buf, opMark)
			for _, item := range chunk {
				if err := e.value(item); err != nil {
					return err
				}
			}
			e.buf = append(e.buf, opAppends)
		}
	case ptuple:
		if len(x) > 3 {
			e.buf = append(e.buf, opMark)
		}
		for _, item := range x {
			if err := e.value(item); err != nil {
				return err
			}
		}
		e.buf = append(e.buf, [...]byte{opEmptyTuple, opTuple1, opTuple2, opTuple3, opTuple}[min(len(x), 4)])
	case pdict:
		e.buf = append(e.buf, opEmptyDict)
		if len(x) == 1 {
			e.string(x[0].k)
			if err := e.value(x[0].v); err != nil {
				return err
			}
			e.buf = append(e.buf, opSetItem)
			break
		}
		for chunk := range slices.Chunk(x, pickleBatch) {
			e.buf = append(e.buf, opMark)
			for _, kv := range chunk {
				e.string(kv.k)
				if err := e.value(kv.v); err != nil {
					return err
				}
			}
			e.buf = append(e.buf, opSetItems)
		}
	case *pshared:
		if idx, ok := e.shared[x]; ok {
			e.get(idx)
			break
		}
		if err := e.value(x.v); err != nil {
			return err
		}
		e.shared[x] = e.memoize()
	default:
		return fmt.Errorf("pickle: cannot encode %T", v)
	}
	e.boundary()
	return nil
}

// memoize stores the value on top of the stack at the next memo index and
// returns the index.
func (e *pickleEncoder) memoize() uint32 {
	e.buf = append(e.buf, opMemoize)
	e.memoLen++
	return e.memoLen - 1
}

// get pushes the memo's value at idx.
func (e *pickleEncoder) get(idx uint32) {
	if idx < 256 {
		e.buf = append(e.buf, opBinGet, byte(idx))
		return
	}
	e.buf = append(e.buf, opLongBinGet)
	e.buf = binary.LittleEndian.AppendUint32(e.buf, idx)
}

// string writes s, or fetches it from the memo when it was written
// before.
func (e *pickleEncoder) string(s string) {
	if idx, ok := e.strings[s]; ok {
		e.get(idx)
		return
	}
	if len(s) < 256 {
		e.buf = append(e.buf, opShortUnicode, byte(len(s)))
	} else {
		e.buf = append(e.buf, opBinUnicode)
		e.buf = binary.LittleEndian.AppendUint32(e.buf, uint32(len(s)))
	}
	e.buf = append(e.buf, s...)
	if len(s) >= minMemoStringLen {
		e.strings[s] = e.memoize()
	}
}

// int writes a signed integer: BININT1 or BININT2 when it fits one or two
// unsigned bytes, BININT when it fits 32 signed bits, else LONG1.
func (e *pickleEncoder) int(x int64) {
	switch {
	case x >= 0 && x < 1<<8:
		e.buf = append(e.buf, opBinInt1, byte(x))
	case x >= 0 && x < 1<<16:
		e.buf = append(e.buf, opBinInt2)
		e.buf = binary.LittleEndian.AppendUint16(e.buf, uint16(x))
	case x >= math.MinInt32 && x <= math.MaxInt32:
		e.buf = append(e.buf, opBinInt)
		e.buf = binary.LittleEndian.AppendUint32(e.buf, uint32(int32(x)))
	default:
		e.long(uint64(x), x < 0)
	}
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
	e.buf = append(e.buf, opLong1, byte(n))
	e.buf = append(e.buf, b[:n]...)
}
