// This file holds the safe pickle reader behind the snapshot importer: a
// small stack machine that runs only the opcodes that build plain data,
// reading its input as a stream, under limits.

package pytorch

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/nlpodyssey/gopickle/types"

	"github.com/gpumem/gpumem/trace"
)

// A pickle is a program for a small stack machine, and some of its opcodes
// name Python callables (GLOBAL, STACK_GLOBAL, INST) and call them (REDUCE,
// OBJ, NEWOBJ, BUILD) or hand ids to the host (PERSID, EXT*). The machine
// here runs only the opcodes that build plain data (None, bools, numbers,
// strings, bytes, lists, tuples, dicts, sets, the memo and framing, and
// protocol 5's in-band read-only buffers) and refuses the others before
// they do anything; protocol 5's out-of-band buffers (NEXT_BUFFER) are
// refused too, as the caller's to supply, which a file cannot. It reads the pickle as a
// stream and stops at STOP, so nothing after it is read, and it builds
// the values of gopickle's types package: nil, bool, int, *big.Int,
// float64, string, []byte, *types.ByteArray, *types.List, *types.Tuple,
// *types.Dict, *types.Set, *types.FrozenSet.
//
// The limits (see the package doc) keep its memory and time in proportion
// to the input however the input is made: every length is checked against
// the size limit before anything is read, long data is read as it arrives
// (so a length field cannot make it allocate what the input does not
// hold), the values built are counted against the memory limit, and
// marks, loose stack values and integers are bounded.

// Limits of the pickle reader. The size and memory limits are options of
// ReadSnapshot (SnapshotOptions); these are fixed.
const (
	// DefaultMaxPickleSize is the largest pickle ReadSnapshot reads when
	// SnapshotOptions.MaxSize is 0: 1 GiB, counted after decompression.
	DefaultMaxPickleSize = 1 << 30
	// DefaultMaxPickleMemory bounds the values ReadSnapshot decodes and
	// what it imports from them when SnapshotOptions.MaxMemory is 0:
	// 1 GiB.
	DefaultMaxPickleMemory = 1 << 30

	// maxPickleDepth bounds the marks open at once (MARK pushes one,
	// APPENDS, SETITEMS, TUPLE ... pop one); Python's own pickler opens
	// one per level of nesting of the data. It also bounds pyRepr.
	maxPickleDepth = 64
	// maxPickleStack bounds the values on the stack that no container
	// holds yet; Python's pickler puts at most 1,000 items (2,000 for a
	// dict) there per level before it moves them into their container.
	maxPickleStack = 1 << 20
	// maxIntDigits is Python's own limit on the digits of an int read
	// from text (sys.int_info.default_max_str_digits): the INT and LONG
	// opcodes carry decimal text, whose conversion costs the square of
	// its length.
	maxIntDigits = 4300
	// maxLongBytes bounds the binary integers of LONG1 and LONG4: 2 KiB,
	// about 4,900 decimal digits.
	maxLongBytes = 2048
	// maxTextLine bounds the protocol-0 string lines (STRING, UNICODE).
	maxTextLine = 1 << 20
)

// The costs, in bytes, that the reader counts against the memory limit:
// about what each allocation takes on the Go heap. Everything the reader
// allocates for values is counted when allocated, garbage included (a
// value built and dropped, the old array of a container that grew), so
// that the limit bounds what the reader allocates, not only what it
// keeps. Containers grow by doubling, so that their garbage is at most
// their size.
const (
	costBox       = 8  // an int or float boxed in an interface (None, bools and 0..255 are free)
	costString    = 16 // a string's header boxed in an interface, before its bytes
	costContainer = 48 // a list, tuple, dict or set before its items
	costItem      = 16 // an element slot of a list or tuple, a memo slot
	costEntry     = 32 // a dict entry
	costSetItem   = 48 // a set element (a map entry)
	costSparse    = 64 // a memo entry stored out of order (a map entry)
)

// pickleOpNames names the opcodes, for messages; those in refused build or
// call Python objects.
var pickleOpNames = [256]string{
	'(': "MARK", '.': "STOP", '0': "POP", '1': "POP_MARK", '2': "DUP", 'N': "NONE",
	'a': "APPEND", 'e': "APPENDS", 'd': "DICT", '}': "EMPTY_DICT", 'l': "LIST", ']': "EMPTY_LIST",
	's': "SETITEM", 'u': "SETITEMS", 't': "TUPLE", ')': "EMPTY_TUPLE", 0x85: "TUPLE1", 0x86: "TUPLE2",
	0x87: "TUPLE3", 0x88: "NEWTRUE", 0x89: "NEWFALSE", 0x8f: "EMPTY_SET", 0x90: "ADDITEMS",
	0x91: "FROZENSET", 0x94: "MEMOIZE", 'J': "BININT", 'K': "BININT1", 'M': "BININT2",
	'G': "BINFLOAT", 'h': "BINGET", 'j': "LONG_BINGET", 'q': "BINPUT", 'r': "LONG_BINPUT",
	0x80: "PROTO", 'U': "SHORT_BINSTRING", 0x8c: "SHORT_BINUNICODE", 'C': "SHORT_BINBYTES",
	0x8a: "LONG1", 'T': "BINSTRING", 'X': "BINUNICODE", 'B': "BINBYTES", 0x8b: "LONG4",
	0x8d: "BINUNICODE8", 0x8e: "BINBYTES8", 0x96: "BYTEARRAY8", 'I': "INT", 'L': "LONG",
	'F': "FLOAT", 'S': "STRING", 'V': "UNICODE", 'g': "GET", 'p': "PUT", 0x95: "FRAME",

	'c': "GLOBAL", 0x93: "STACK_GLOBAL", 'R': "REDUCE", 'b': "BUILD", 'i': "INST", 'o': "OBJ",
	0x81: "NEWOBJ", 0x92: "NEWOBJ_EX", 'P': "PERSID", 'Q': "BINPERSID", 0x82: "EXT1", 0x83: "EXT2",
	0x84: "EXT4", 0x97: "NEXT_BUFFER", 0x98: "READONLY_BUFFER",
}

var refused = [256]bool{'c': true, 0x93: true, 'R': true, 'b': true, 'i': true, 'o': true,
	0x81: true, 0x92: true, 'P': true, 'Q': true, 0x82: true, 0x83: true, 0x84: true}

// pickleLimits are the limits of one load.
type pickleLimits struct {
	size   int64 // bytes of pickle
	memory int64 // bytes of values, as counted with the costs above
}

// unpickler is the state of one load.
type unpickler struct {
	r     *bufio.Reader
	pos   int64 // bytes read
	lim   pickleLimits
	spent int64 // bytes of values built, by the costs above

	// frameEnd is where the current FRAME ends (protocol 4 and 5): the
	// byte after its last one; 0 before the first FRAME.
	frameEnd int64

	stack  []any
	marks  []int // stack positions of the open marks
	memo   []any
	sparse map[uint64]any // memo entries at indices past the end of memo
	buf    [8]byte
}

// decodePickle decodes the pickle at the start of r, which may hold plain
// data only, under lim. It reads nothing after the STOP opcode.
func decodePickle(r io.Reader, lim pickleLimits) (any, error) {
	v, _, err := decodePickleSpent(r, lim)
	return v, err
}

// decodePickleSpent is decodePickle that also returns the bytes of values
// it counted against lim.memory, so that the import that follows can
// spend the rest of the same budget.
func decodePickleSpent(r io.Reader, lim pickleLimits) (v any, spent int64, err error) {
	u := &unpickler{r: bufio.NewReaderSize(io.LimitReader(r, lim.size+1), 64<<10), lim: lim}
	v, err = u.run()
	return v, u.spent, err
}

// run decodes the pickle.
func (u *unpickler) run() (any, error) {
	for {
		at := u.pos
		code, err := u.r.ReadByte()
		if err != nil {
			return nil, u.readError(at, "the data ends before the STOP opcode", err)
		}
		u.pos++
		name := pickleOpNames[code]
		if name == "" {
			return nil, fmt.Errorf("pickle: unknown opcode 0x%02x at byte %d", code, at)
		}
		if refused[code] {
			return nil, fmt.Errorf("pickle: opcode %s at byte %d would build a Python object; "+
				"only plain data (dicts, lists, tuples, strings, numbers) is accepted", name, at)
		}
		if code == '.' {
			v, err := u.pop()
			if err != nil {
				return nil, fmt.Errorf("pickle: STOP at byte %d: %w", at, err)
			}
			return v, nil
		}
		if err := u.step(code); err != nil {
			var re *readErr
			if errors.As(err, &re) {
				return nil, u.readError(at, name+" runs past the end of the data", re.err)
			}
			return nil, fmt.Errorf("pickle: %s at byte %d: %w", name, at, err)
		}
		if len(u.stack) > maxPickleStack {
			return nil, fmt.Errorf("pickle: %s at byte %d: more than %d values on the stack outside any container", name, at, maxPickleStack)
		}
	}
}

// readErr is a failed read of the input.
type readErr struct{ err error }

func (e *readErr) Error() string { return e.err.Error() }

// readError says why the input ran out at byte at: the size limit, the end
// of the data, or a failed read.
func (u *unpickler) readError(at int64, short string, err error) error {
	switch {
	case u.pos > u.lim.size:
		return fmt.Errorf("pickle: larger than %d bytes, the limit of the pickle's size", u.lim.size)
	case err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF):
		if at == 0 && u.pos == 0 {
			return errors.New("pickle: empty input")
		}
		return fmt.Errorf("pickle: %s (at byte %d): the data is cut short", short, at)
	}
	return fmt.Errorf("pickle: reading byte %d: %w", u.pos, err)
}

// step runs the opcode code, whose byte has been read.
func (u *unpickler) step(code byte) error {
	switch code {
	case 0x80: // PROTO
		b, err := u.fixed(1)
		if err == nil && b[0] > 5 {
			err = fmt.Errorf("unsupported pickle protocol %d", b[0])
		}
		return err
	case 0x95: // FRAME
		return u.frameOp()
	case 0x97: // NEXT_BUFFER
		return errors.New("the pickle takes an out-of-band buffer (protocol 5's buffer_callback), " +
			"which a snapshot file does not carry; write the snapshot without buffer_callback")
	case 0x98: // READONLY_BUFFER: bytes are read-only already
		v, err := u.top()
		if err != nil {
			return err
		}
		switch b := v.(type) {
		case []byte:
		case *types.ByteArray:
			u.stack[len(u.stack)-1] = []byte(*b)
		default:
			return fmt.Errorf("a read-only view of a %s, not of bytes", pyTypeName(v))
		}
		return nil
	case '(': // MARK
		if len(u.marks) == maxPickleDepth {
			return fmt.Errorf("more than %d marks open at once (the data nests too deeply)", maxPickleDepth)
		}
		u.marks = append(u.marks, len(u.stack))
		return nil
	case '0': // POP: the top value, or the mark when none is above it
		if u.frame() > 0 {
			u.drop(1)
			return nil
		}
		_, err := u.popMark()
		return err
	case '1': // POP_MARK
		items, err := u.popMark()
		clear(items)
		return err
	case '2': // DUP
		v, err := u.top()
		if err == nil {
			u.push(v)
		}
		return err
	case 'N':
		return u.scalar(nil)
	case 0x88:
		return u.scalar(true)
	case 0x89:
		return u.scalar(false)
	case 'J', 'K', 'M', 'G':
		return u.binaryNumber(code)
	case 'I', 'L':
		return u.textInt(code)
	case 'F':
		line, err := u.line(maxIntDigits + 100)
		if err != nil {
			return err
		}
		f, perr := strconv.ParseFloat(strings.TrimSpace(string(line)), 64)
		if perr != nil {
			return fmt.Errorf("bad float %s", trace.Quote(line))
		}
		return u.scalar(f)
	case 0x8a, 0x8b: // LONG1, LONG4
		return u.binaryLong(code)
	case 'U', 0x8c, 'C', 'T', 'X', 'B', 0x8d, 0x8e, 0x96:
		return u.binaryString(code)
	case 'S', 'V':
		return u.textString(code)
	case ']', ')', '}', 0x8f:
		return u.emptyContainer(code)
	case 'l', 't', 'd', 0x91: // LIST, TUPLE, DICT, FROZENSET from the mark
		return u.fromMark(code)
	case 0x85, 0x86, 0x87: // TUPLE1, TUPLE2, TUPLE3
		n := int(code - 0x84)
		if u.frame() < n {
			return errors.New("stack underflow")
		}
		if err := u.spend(costContainer + int64(n)*costItem); err != nil {
			return err
		}
		t := make(types.Tuple, n)
		copy(t, u.stack[len(u.stack)-n:])
		u.drop(n)
		u.push(&t)
		return nil
	case 'a', 'e': // APPEND, APPENDS
		return u.appends(code)
	case 's', 'u': // SETITEM, SETITEMS
		return u.setItems(code)
	case 0x90: // ADDITEMS
		return u.addItems()
	case 'g', 'h', 'j': // GET, BINGET, LONG_BINGET
		idx, err := u.memoIndex(code)
		if err != nil {
			return err
		}
		v, ok := u.memoGet(idx)
		if !ok {
			return fmt.Errorf("memo index %d was never stored", idx)
		}
		u.push(v)
		return nil
	case 'p', 'q', 'r', 0x94: // PUT, BINPUT, LONG_BINPUT, MEMOIZE
		idx := uint64(len(u.memo) + len(u.sparse))
		if code != 0x94 {
			var err error
			if idx, err = u.memoIndex(code); err != nil {
				return err
			}
		}
		v, err := u.top()
		if err != nil {
			return err
		}
		return u.memoPut(idx, v)
	}
	return fmt.Errorf("opcode 0x%02x is not handled", code)
}

// frameOp runs FRAME (protocol 4 and 5): an 8-byte length, then that
// many bytes of opcodes, which the reader runs as they arrive (a frame is
// a hint for buffering, and Python's pickler never splits an opcode
// across two). A frame must begin where the one before it ends, as
// Python's unpickler requires, and its length must fit in what is left of
// the size limit: it is checked, never allocated.
func (u *unpickler) frameOp() error {
	at := u.pos - 1
	b, err := u.fixed(8)
	if err != nil {
		return err
	}
	n := binary.LittleEndian.Uint64(b)
	if at < u.frameEnd {
		return fmt.Errorf("a frame begins %d bytes before the end of the frame before it", u.frameEnd-at)
	}
	if n > uint64(u.lim.size-u.pos) {
		return fmt.Errorf("a frame of %d bytes runs past the limit of the pickle's size (%d bytes)", n, u.lim.size)
	}
	u.frameEnd = u.pos + int64(n)
	return nil
}

// frame returns the number of values above the innermost mark: the only
// ones an opcode may use.
func (u *unpickler) frame() int {
	if n := len(u.marks); n > 0 {
		return len(u.stack) - u.marks[n-1]
	}
	return len(u.stack)
}

// push pushes v. The stack is bounded by maxPickleStack and not counted
// against the memory limit (it holds at most 16 MiB); it grows by
// doubling.
func (u *unpickler) push(v any) {
	if len(u.stack) == cap(u.stack) {
		s := make([]any, len(u.stack), max(min(2*cap(u.stack), maxPickleStack+1), 64))
		copy(s, u.stack)
		u.stack = s
	}
	u.stack = append(u.stack, v)
}

func (u *unpickler) drop(n int) {
	clear(u.stack[len(u.stack)-n:])
	u.stack = u.stack[:len(u.stack)-n]
}

func (u *unpickler) top() (any, error) {
	if u.frame() == 0 {
		return nil, errors.New("stack underflow")
	}
	return u.stack[len(u.stack)-1], nil
}

func (u *unpickler) pop() (any, error) {
	v, err := u.top()
	if err == nil {
		u.drop(1)
	}
	return v, err
}

// popMark closes the innermost mark and returns the values above it. They
// share the stack's memory: use them before the next push, then clear
// them.
func (u *unpickler) popMark() ([]any, error) {
	n := len(u.marks)
	if n == 0 {
		return nil, errors.New("no MARK is open")
	}
	m := u.marks[n-1]
	u.marks = u.marks[:n-1]
	items := u.stack[m:]
	u.stack = u.stack[:m]
	return items, nil
}

// spend counts n bytes of values against the memory limit.
func (u *unpickler) spend(n int64) error {
	if u.spent += n; u.spent > u.lim.memory {
		return fmt.Errorf("the decoded values need more than %d bytes of memory, the limit "+
			"(a snapshot recorded with fewer entries, or without stack frames, is smaller)", u.lim.memory)
	}
	return nil
}

// grow returns s with room for n more elements of size bytes, doubling
// its capacity when it must grow and counting the new array.
func grow[T any](u *unpickler, s []T, n, size int) ([]T, error) {
	if len(s)+n <= cap(s) {
		return s, nil
	}
	c := max(2*cap(s), len(s)+n, 4)
	if err := u.spend(int64(c) * int64(size)); err != nil {
		return s, err
	}
	g := make([]T, len(s), c)
	copy(g, s)
	return g, nil
}

// scalar pushes None, a bool, an int or a float, counting its box.
func (u *unpickler) scalar(v any) error {
	switch x := v.(type) {
	case int:
		if x < 0 || x > 255 {
			if err := u.spend(costBox); err != nil {
				return err
			}
		}
	case float64:
		if err := u.spend(costBox); err != nil {
			return err
		}
	}
	u.push(v)
	return nil
}
