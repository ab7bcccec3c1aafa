// This file holds the opcodes of the pickle reader (pickle.go) that read
// their arguments and build values: numbers, strings, containers, the memo.

package pytorch

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"strconv"
	"strings"

	"github.com/nlpodyssey/gopickle/types"

	"github.com/gpumem/gpumem/trace"
)

// fixed reads n <= 8 bytes.
func (u *unpickler) fixed(n int) ([]byte, error) {
	b := u.buf[:n]
	m, err := io.ReadFull(u.r, b)
	u.pos += int64(m)
	if err != nil {
		return nil, &readErr{err}
	}
	return b, nil
}

// data reads n bytes of string data. It checks n against the size limit
// and counts it against the memory limit first, and it grows its buffer
// as the bytes arrive, so that a length the input does not back costs
// nothing.
func (u *unpickler) data(n uint64) ([]byte, error) {
	if n > uint64(u.lim.size-u.pos) {
		return nil, fmt.Errorf("a length of %d bytes runs past the limit of the pickle's size (%d bytes)", n, u.lim.size)
	}
	// Beyond 64 KiB the buffer doubles as the bytes arrive: count the
	// arrays it leaves behind too.
	cost := int64(n) + costString
	if n > 64<<10 {
		cost += int64(n)
	}
	if err := u.spend(cost); err != nil {
		return nil, err
	}
	b := make([]byte, 0, min(n, 64<<10))
	for uint64(len(b)) < n {
		if len(b) == cap(b) {
			g := make([]byte, len(b), min(2*uint64(cap(b)), n))
			copy(g, b)
			b = g
		}
		m, err := u.r.Read(b[len(b):min(uint64(cap(b)), n)])
		b = b[:len(b)+m]
		u.pos += int64(m)
		if err != nil && uint64(len(b)) < n {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, &readErr{err}
		}
	}
	return b, nil
}

// errTextTooLong is a text argument longer than its opcode allows.
var errTextTooLong = errors.New("text argument too long")

// line reads up to and including '\n', at most max bytes, and returns the
// line without it; a longer line is errTextTooLong.
func (u *unpickler) line(max int) ([]byte, error) {
	var acc []byte
	for {
		b, err := u.r.ReadSlice('\n')
		u.pos += int64(len(b))
		if len(acc)+len(b) > max+1 {
			return nil, fmt.Errorf("%w (more than %d bytes)", errTextTooLong, max)
		}
		switch {
		case err == nil:
			if acc == nil {
				return b[:len(b)-1], nil
			}
			acc = append(acc, b...)
			return acc[:len(acc)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			acc = append(acc, b...)
		case err == io.EOF:
			return nil, &readErr{io.ErrUnexpectedEOF}
		default:
			return nil, &readErr{err}
		}
	}
}

func (u *unpickler) binaryNumber(code byte) error {
	var v any
	switch code {
	case 'J':
		b, err := u.fixed(4)
		if err != nil {
			return err
		}
		v = int(int32(binary.LittleEndian.Uint32(b)))
	case 'K':
		b, err := u.fixed(1)
		if err != nil {
			return err
		}
		v = int(b[0])
	case 'M':
		b, err := u.fixed(2)
		if err != nil {
			return err
		}
		v = int(binary.LittleEndian.Uint16(b))
	case 'G':
		b, err := u.fixed(8)
		if err != nil {
			return err
		}
		v = math.Float64frombits(binary.BigEndian.Uint64(b))
	}
	return u.scalar(v)
}

// textInt runs INT and LONG: decimal text (or Python's 0x, 0o, 0b forms)
// and a newline; INT's "01" and "00" are True and False.
func (u *unpickler) textInt(code byte) error {
	line, err := u.line(maxIntDigits + 16)
	if errors.Is(err, errTextTooLong) {
		return errTooManyDigits
	}
	if err != nil {
		return err
	}
	s := strings.TrimSpace(string(line))
	if code == 'I' && (s == "01" || s == "00") {
		return u.scalar(s == "01")
	}
	if code == 'L' {
		s = strings.TrimSuffix(s, "L")
	}
	v, err := parsePyInt(s)
	if err != nil {
		return err
	}
	if b, ok := v.(*big.Int); ok {
		if err := u.spend(int64(len(b.Bits())) * 8); err != nil {
			return err
		}
	}
	return u.scalar(v)
}

var errTooManyDigits = fmt.Errorf("an integer of more than %d digits (Python's own limit for int strings)", maxIntDigits)

// parsePyInt parses an integer as Python's int(s, 0) does, up to
// maxIntDigits digits: an int when it fits 64 bits, else a *big.Int.
func parsePyInt(s string) (any, error) {
	digits := strings.TrimLeft(s, "+-")
	if len(digits) > maxIntDigits {
		return nil, errTooManyDigits
	}
	if len(digits) > 1 && digits[0] == '0' && strings.Trim(digits, "0_") != "" &&
		!strings.ContainsAny(digits[1:2], "xXoObB") {
		return nil, fmt.Errorf("bad integer %s (a leading zero)", trace.Quote(s))
	}
	if i, err := strconv.ParseInt(s, 0, 64); err == nil {
		return int(i), nil
	}
	b, ok := new(big.Int).SetString(s, 0)
	if !ok {
		return nil, fmt.Errorf("bad integer %s", trace.Quote(s))
	}
	return b, nil
}

// binaryLong runs LONG1 and LONG4: a little-endian two's-complement
// integer of the given length (an empty one is 0).
func (u *unpickler) binaryLong(code byte) error {
	var n int64
	if code == 0x8a {
		b, err := u.fixed(1)
		if err != nil {
			return err
		}
		n = int64(b[0])
	} else {
		b, err := u.fixed(4)
		if err != nil {
			return err
		}
		if n = int64(int32(binary.LittleEndian.Uint32(b))); n < 0 {
			return errors.New("a negative length")
		}
	}
	if n > maxLongBytes {
		return fmt.Errorf("an integer of %d bytes (the limit is %d)", n, maxLongBytes)
	}
	b, err := u.data(uint64(n))
	if err != nil {
		return err
	}
	u.push(decodeLong(b))
	return nil
}

// decodeLong decodes a little-endian two's-complement integer.
func decodeLong(b []byte) any {
	if len(b) == 0 {
		return 0
	}
	if len(b) <= 8 {
		var x uint64
		for i := len(b) - 1; i >= 0; i-- {
			x = x<<8 | uint64(b[i])
		}
		if shift := 64 - 8*uint(len(b)); shift > 0 {
			return int(int64(x<<shift) >> shift) // sign-extend
		}
		return int(int64(x))
	}
	be := make([]byte, len(b))
	for i, c := range b {
		be[len(b)-1-i] = c
	}
	v := new(big.Int).SetBytes(be)
	if b[len(b)-1] >= 0x80 {
		v.Sub(v, new(big.Int).Lsh(big.NewInt(1), uint(8*len(b))))
	}
	if v.IsInt64() {
		return int(v.Int64())
	}
	return v
}

// binaryString runs the length-prefixed string, bytes and bytearray
// opcodes.
func (u *unpickler) binaryString(code byte) error {
	var n uint64
	switch code {
	case 'U', 0x8c, 'C': // 1-byte length
		b, err := u.fixed(1)
		if err != nil {
			return err
		}
		n = uint64(b[0])
	case 'T', 'X', 'B': // 4-byte length, signed for BINSTRING
		b, err := u.fixed(4)
		if err != nil {
			return err
		}
		n = uint64(binary.LittleEndian.Uint32(b))
		if code == 'T' && int32(n) < 0 {
			return errors.New("a negative length")
		}
	default: // 8-byte length
		b, err := u.fixed(8)
		if err != nil {
			return err
		}
		n = binary.LittleEndian.Uint64(b)
	}
	b, err := u.data(n)
	if err != nil {
		return err
	}
	switch code {
	case 'C', 'B', 0x8e:
		u.push(b)
	case 0x96:
		ba := types.ByteArray(b)
		u.push(&ba)
	default:
		if err := u.spend(int64(len(b))); err != nil { // the string's copy
			return err
		}
		u.push(string(b))
	}
	return nil
}

// textString runs STRING (a quoted Python bytes literal) and UNICODE
// (raw-unicode-escape text), protocol 0's strings.
func (u *unpickler) textString(code byte) error {
	line, err := u.line(maxTextLine)
	if err != nil {
		return err
	}
	if err := u.spend(int64(len(line)) + costString); err != nil {
		return err
	}
	if code == 'V' {
		u.push(rawUnicodeDecode(line))
		return nil
	}
	if len(line) < 2 || line[0] != line[len(line)-1] || (line[0] != '\'' && line[0] != '"') {
		return errors.New("the argument must be quoted")
	}
	s, err := escapeDecode(line[1 : len(line)-1])
	if err != nil {
		return err
	}
	u.push(s)
	return nil
}

func (u *unpickler) emptyContainer(code byte) error {
	if err := u.spend(costContainer); err != nil {
		return err
	}
	switch code {
	case ']':
		u.push(&types.List{})
	case ')':
		u.push(&types.Tuple{})
	case '}':
		u.push(&types.Dict{})
	case 0x8f:
		u.push(types.NewSet())
	}
	return nil
}

// fromMark runs LIST, TUPLE, DICT and FROZENSET, which build a container
// of the values above the innermost mark.
func (u *unpickler) fromMark(code byte) error {
	items, err := u.popMark()
	if err != nil {
		return err
	}
	var v any // pushed after items are cleared: they share the stack's memory
	switch code {
	case 'l', 't':
		if err := u.spend(costContainer + int64(len(items))*costItem); err != nil {
			return err
		}
		s := append([]any(nil), items...)
		if code == 'l' {
			l := types.List(s)
			v = &l
		} else {
			t := types.Tuple(s)
			v = &t
		}
	case 'd':
		if len(items)%2 != 0 {
			return errors.New("an odd number of keys and values")
		}
		if err := u.spend(costContainer + int64(len(items)/2)*costEntry); err != nil {
			return err
		}
		d := make(types.Dict, 0, len(items)/2)
		for i := 0; i < len(items); i += 2 {
			d = append(d, types.DictEntry{Key: items[i], Value: items[i+1]})
		}
		v = &d
	case 0x91:
		if err := u.spend(costContainer + int64(len(items))*costSetItem); err != nil {
			return err
		}
		keys := make([]any, len(items))
		for i, it := range items {
			keys[i] = setKey(it)
		}
		v = types.NewFrozenSetFromSlice(keys)
	}
	clear(items)
	u.push(v)
	return nil
}

// appends runs APPEND (one value) and APPENDS (the values above the mark)
// on the list below them.
func (u *unpickler) appends(code byte) error {
	var items []any
	if code == 'a' {
		v, err := u.pop()
		if err != nil {
			return err
		}
		items = []any{v}
	} else {
		var err error
		if items, err = u.popMark(); err != nil {
			return err
		}
		defer clear(items)
	}
	v, err := u.top()
	if err != nil {
		return err
	}
	l, ok := v.(*types.List)
	if !ok {
		return fmt.Errorf("appending to a %s, not a list", pyTypeName(v))
	}
	s, err := grow(u, []any(*l), len(items), costItem)
	if err != nil {
		return err
	}
	*l = append(s, items...)
	return nil
}

// setItems runs SETITEM (one key and value) and SETITEMS (the keys and
// values above the mark) on the dict below them. Keys are kept in order,
// a repeated key too; dictGet takes the last, as Python keeps the last.
func (u *unpickler) setItems(code byte) error {
	var items []any
	if code == 's' {
		if u.frame() < 2 {
			return errors.New("stack underflow")
		}
		items = []any{u.stack[len(u.stack)-2], u.stack[len(u.stack)-1]}
		u.drop(2)
	} else {
		var err error
		if items, err = u.popMark(); err != nil {
			return err
		}
		defer clear(items)
		if len(items)%2 != 0 {
			return errors.New("an odd number of keys and values")
		}
	}
	v, err := u.top()
	if err != nil {
		return err
	}
	d, ok := v.(*types.Dict)
	if !ok {
		return fmt.Errorf("setting items of a %s, not a dict", pyTypeName(v))
	}
	s, err := grow(u, []types.DictEntry(*d), len(items)/2, costEntry)
	if err != nil {
		return err
	}
	for i := 0; i < len(items); i += 2 {
		s = append(s, types.DictEntry{Key: items[i], Value: items[i+1]})
	}
	*d = s
	return nil
}

// addItems runs ADDITEMS: the values above the mark join the set below.
func (u *unpickler) addItems() error {
	items, err := u.popMark()
	if err != nil {
		return err
	}
	defer clear(items)
	v, err := u.top()
	if err != nil {
		return err
	}
	set, ok := v.(*types.Set)
	if !ok {
		return fmt.Errorf("ADDITEMS to a %s", pyTypeName(v))
	}
	for _, it := range items {
		if err := u.spend(costSetItem); err != nil {
			return err
		}
		set.Add(setKey(it))
	}
	return nil
}

// setKey returns v as a set element: bytes, which Go cannot hash, become
// a string of the same bytes.
func setKey(v any) any {
	if b, ok := v.([]byte); ok {
		return string(b)
	}
	return v
}

// memoIndex reads the index argument of a memo opcode.
func (u *unpickler) memoIndex(code byte) (uint64, error) {
	switch code {
	case 'h', 'q':
		b, err := u.fixed(1)
		if err != nil {
			return 0, err
		}
		return uint64(b[0]), nil
	case 'j', 'r':
		b, err := u.fixed(4)
		if err != nil {
			return 0, err
		}
		return uint64(binary.LittleEndian.Uint32(b)), nil
	}
	line, err := u.line(32)
	if err != nil {
		return 0, err
	}
	idx, perr := strconv.ParseUint(strings.TrimSpace(string(line)), 10, 64)
	if perr != nil {
		return 0, fmt.Errorf("bad memo index %s", trace.Quote(line))
	}
	return idx, nil
}

func (u *unpickler) memoGet(idx uint64) (any, bool) {
	if idx < uint64(len(u.memo)) {
		return u.memo[idx], true
	}
	v, ok := u.sparse[idx]
	return v, ok
}

// memoPut stores v at idx: in the slice when idx extends it, else in the
// map of entries stored out of order.
func (u *unpickler) memoPut(idx uint64, v any) error {
	switch {
	case idx < uint64(len(u.memo)):
		u.memo[idx] = v
		return nil
	case idx > uint64(len(u.memo)):
		if _, ok := u.sparse[idx]; !ok {
			if err := u.spend(costSparse); err != nil {
				return err
			}
		}
		if u.sparse == nil {
			u.sparse = make(map[uint64]any)
		}
		u.sparse[idx] = v
		return nil
	}
	// Entries stored ahead of the slice's end join it once it reaches them.
	for {
		m, err := grow(u, u.memo, 1, costItem)
		if err != nil {
			return err
		}
		u.memo = append(m, v)
		var ok bool
		if v, ok = u.sparse[uint64(len(u.memo))]; !ok {
			return nil
		}
		delete(u.sparse, uint64(len(u.memo)))
	}
}
