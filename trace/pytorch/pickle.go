// This file holds the safe pickle loader behind the snapshot importer: an
// opcode scan that admits plain data only, then gopickle's decoder.

package pytorch

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/big"
	"strconv"

	"github.com/nlpodyssey/gopickle/pickle"
	"github.com/nlpodyssey/gopickle/types"
)

// A pickle is a program for a small stack machine, and some of its opcodes
// name Python callables (GLOBAL, STACK_GLOBAL, INST) and call them (REDUCE,
// OBJ, NEWOBJ, BUILD) or hand ids to the host (PERSID, EXT*). gopickle never
// runs Python, but it does build stand-in objects for named classes, and it
// trusts length fields, so a ten-byte pickle could make it allocate
// gigabytes. scanPickle therefore walks the opcodes first, against the
// whole input held in memory: it admits only the opcodes that build plain
// data (None, bools, numbers, strings, bytes, lists, tuples, dicts, sets,
// the memo and framing), and checks that every length fits in the bytes
// that remain. What passes decodes to plain Go values in at most a few
// times the input's size.

// pickleArg says how an admitted opcode's argument is laid out.
type pickleArg int8

const (
	argNone     pickleArg = iota // no argument
	argFixed                     // a fixed number of bytes
	argLen1                      // 1-byte length, then that many bytes
	argLen4                      // 4-byte little-endian length, then bytes
	argLen8                      // 8-byte little-endian length, then bytes
	argLine                      // text up to and including '\n'
	argFrame                     // 8-byte frame length (the frame follows inline)
	argRejected                  // builds or calls objects: refused
)

type pickleOp struct {
	name string
	arg  pickleArg
	n    int // size for argFixed
}

var pickleOps = map[byte]pickleOp{
	'(': {"MARK", argNone, 0}, '.': {"STOP", argNone, 0}, '0': {"POP", argNone, 0},
	'1': {"POP_MARK", argNone, 0}, '2': {"DUP", argNone, 0}, 'N': {"NONE", argNone, 0},
	'a': {"APPEND", argNone, 0}, 'e': {"APPENDS", argNone, 0}, 'd': {"DICT", argNone, 0},
	'}': {"EMPTY_DICT", argNone, 0}, 'l': {"LIST", argNone, 0}, ']': {"EMPTY_LIST", argNone, 0},
	's': {"SETITEM", argNone, 0}, 'u': {"SETITEMS", argNone, 0}, 't': {"TUPLE", argNone, 0},
	')': {"EMPTY_TUPLE", argNone, 0}, 0x85: {"TUPLE1", argNone, 0}, 0x86: {"TUPLE2", argNone, 0},
	0x87: {"TUPLE3", argNone, 0}, 0x88: {"NEWTRUE", argNone, 0}, 0x89: {"NEWFALSE", argNone, 0},
	0x8f: {"EMPTY_SET", argNone, 0}, 0x90: {"ADDITEMS", argNone, 0}, 0x91: {"FROZENSET", argNone, 0},
	0x94: {"MEMOIZE", argNone, 0},

	'J': {"BININT", argFixed, 4}, 'K': {"BININT1", argFixed, 1}, 'M': {"BININT2", argFixed, 2},
	'G': {"BINFLOAT", argFixed, 8}, 'h': {"BINGET", argFixed, 1}, 'j': {"LONG_BINGET", argFixed, 4},
	'q': {"BINPUT", argFixed, 1}, 'r': {"LONG_BINPUT", argFixed, 4}, 0x80: {"PROTO", argFixed, 1},

	'U': {"SHORT_BINSTRING", argLen1, 0}, 0x8c: {"SHORT_BINUNICODE", argLen1, 0},
	'C': {"SHORT_BINBYTES", argLen1, 0}, 0x8a: {"LONG1", argLen1, 0},
	'T': {"BINSTRING", argLen4, 0}, 'X': {"BINUNICODE", argLen4, 0}, 'B': {"BINBYTES", argLen4, 0},
	0x8b: {"LONG4", argLen4, 0},
	0x8d: {"BINUNICODE8", argLen8, 0}, 0x8e: {"BINBYTES8", argLen8, 0}, 0x96: {"BYTEARRAY8", argLen8, 0},

	'I': {"INT", argLine, 0}, 'L': {"LONG", argLine, 0}, 'F': {"FLOAT", argLine, 0},
	'S': {"STRING", argLine, 0}, 'V': {"UNICODE", argLine, 0}, 'g': {"GET", argLine, 0},
	'p': {"PUT", argLine, 0},

	0x95: {"FRAME", argFrame, 0},

	'c': {"GLOBAL", argRejected, 0}, 0x93: {"STACK_GLOBAL", argRejected, 0},
	'R': {"REDUCE", argRejected, 0}, 'b': {"BUILD", argRejected, 0}, 'i': {"INST", argRejected, 0},
	'o': {"OBJ", argRejected, 0}, 0x81: {"NEWOBJ", argRejected, 0}, 0x92: {"NEWOBJ_EX", argRejected, 0},
	'P': {"PERSID", argRejected, 0}, 'Q': {"BINPERSID", argRejected, 0},
	0x82: {"EXT1", argRejected, 0}, 0x83: {"EXT2", argRejected, 0}, 0x84: {"EXT4", argRejected, 0},
	0x97: {"NEXT_BUFFER", argRejected, 0}, 0x98: {"READONLY_BUFFER", argRejected, 0},
}

// scanPickle checks that data is one pickle of plain data (see above). It
// also follows the memo, so that a GET of an index never stored is refused
// (as Python refuses it) instead of decoding to None.
func scanPickle(data []byte) error {
	memo := map[uint64]bool{}
	for i := 0; i < len(data); {
		at := i
		code := data[i]
		op, ok := pickleOps[code]
		if !ok {
			return fmt.Errorf("pickle: unknown opcode 0x%02x at byte %d", code, at)
		}
		i++
		need := func(n uint64) error {
			if n > uint64(len(data)-i) {
				return fmt.Errorf("pickle: %s at byte %d runs past the end of the data", op.name, at)
			}
			i += int(n)
			return nil
		}
		var err error
		switch op.arg {
		case argNone:
			if code == '.' {
				return nil
			}
		case argFixed:
			err = need(uint64(op.n))
		case argLen1:
			if err = need(1); err == nil {
				err = need(uint64(data[i-1]))
			}
		case argLen4:
			if err = need(4); err == nil {
				n := binary.LittleEndian.Uint32(data[i-4:])
				if code == 0x8b && int32(n) < 0 {
					return fmt.Errorf("pickle: LONG4 at byte %d has a negative length", at)
				}
				err = need(uint64(n))
			}
		case argLen8:
			if err = need(8); err == nil {
				err = need(binary.LittleEndian.Uint64(data[i-8:]))
			}
		case argLine:
			nl := bytes.IndexByte(data[i:], '\n')
			if nl < 0 {
				return fmt.Errorf("pickle: %s at byte %d has no end of line", op.name, at)
			}
			i += nl + 1
		case argFrame:
			if err = need(8); err == nil {
				if n := binary.LittleEndian.Uint64(data[i-8:]); n > uint64(len(data)-i) {
					return fmt.Errorf("pickle: FRAME at byte %d is longer than the data", at)
				}
			}
		case argRejected:
			return fmt.Errorf("pickle: opcode %s at byte %d would build a Python object; "+
				"only plain data (dicts, lists, tuples, strings, numbers) is accepted", op.name, at)
		}
		if err != nil {
			return err
		}
		if err := followMemo(memo, code, data[at+1:i]); err != nil {
			return fmt.Errorf("pickle: %s at byte %d: %w", op.name, at, err)
		}
	}
	return fmt.Errorf("pickle: no STOP opcode: the data is cut short")
}

// followMemo records memo stores and checks memo loads; arg is the
// opcode's argument bytes.
func followMemo(memo map[uint64]bool, code byte, arg []byte) error {
	var idx uint64
	switch code {
	case 'h', 'q': // BINGET, BINPUT
		idx = uint64(arg[0])
	case 'j', 'r': // LONG_BINGET, LONG_BINPUT
		idx = uint64(binary.LittleEndian.Uint32(arg))
	case 'g', 'p': // GET, PUT: decimal text and a newline
		n, err := strconv.ParseUint(string(bytes.TrimSuffix(arg, []byte("\n"))), 10, 32)
		if err != nil {
			return fmt.Errorf("bad memo index %q", arg)
		}
		idx = n
	case 0x94: // MEMOIZE stores at the next free index
		memo[uint64(len(memo))] = true
		return nil
	default:
		return nil
	}
	switch code {
	case 'h', 'j', 'g':
		if !memo[idx] {
			return fmt.Errorf("memo index %d was never stored", idx)
		}
	default:
		memo[idx] = true
	}
	return nil
}

// maxPickleDepth bounds how deeply nested a decoded value may be, and so
// the recursion of the walks over it. (A list or dict that contains itself,
// which the memo can build, is walked once: checkPlain marks what it saw.)
const maxPickleDepth = 64

// loadPickle decodes data, a pickle of plain data, into gopickle's plain
// values: nil, bool, int, *big.Int, float64, string, []byte, *types.List,
// *types.Tuple, *types.Dict, *types.Set, *types.FrozenSet.
func loadPickle(data []byte) (v any, err error) {
	if err := scanPickle(data); err != nil {
		return nil, err
	}
	defer func() {
		// gopickle panics on a few malformed inputs (such as an empty LONG1);
		// they are bad input, not bugs of ours.
		if r := recover(); r != nil {
			v, err = nil, fmt.Errorf("pickle: malformed data (%v)", r)
		}
	}()
	u := pickle.NewUnpickler(bytes.NewReader(data))
	u.FindClass = func(module, name string) (any, error) {
		return nil, fmt.Errorf("pickle: refusing class %s.%s", module, name)
	}
	v, err = u.Load()
	if err != nil {
		return nil, fmt.Errorf("pickle: %w", err)
	}
	if err := checkPlain(v, 0, make(map[any]bool)); err != nil {
		return nil, err
	}
	return v, nil
}

// checkPlain walks v and rejects anything but plain values. It visits each
// container once (seen), so that shared references cannot make the walk
// exponential.
func checkPlain(v any, depth int, seen map[any]bool) error {
	if depth > maxPickleDepth {
		return fmt.Errorf("pickle: data nested more than %d deep (or refers to itself)", maxPickleDepth)
	}
	switch v.(type) {
	case *types.List, *types.Tuple, *types.Dict, *types.Set, *types.FrozenSet:
		if seen[v] {
			return nil
		}
		seen[v] = true
	}
	switch x := v.(type) {
	case nil, bool, int, *big.Int, float64, string, []byte:
		return nil
	case *types.ByteArray:
		return nil
	case *types.List:
		for _, e := range *x {
			if err := checkPlain(e, depth+1, seen); err != nil {
				return err
			}
		}
	case *types.Tuple:
		for _, e := range *x {
			if err := checkPlain(e, depth+1, seen); err != nil {
				return err
			}
		}
	case *types.Dict:
		for _, e := range *x {
			if err := checkPlain(e.Key, depth+1, seen); err != nil {
				return err
			}
			if err := checkPlain(e.Value, depth+1, seen); err != nil {
				return err
			}
		}
	case *types.Set:
		for e := range *x {
			if err := checkPlain(e, depth+1, seen); err != nil {
				return err
			}
		}
	case *types.FrozenSet:
		for e := range *x {
			if err := checkPlain(e, depth+1, seen); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("pickle: unexpected value of type %T", v)
	}
	return nil
}
