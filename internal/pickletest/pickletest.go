// Package pickletest builds the hostile PyTorch snapshot pickles that two
// test suites feed to the snapshot reader: trace/pytorch's tests of the
// pickle reader's limits, and the command's catalogue of hostile inputs.
//
// # Model
//
// Each function returns a protocol-2 pickle, written opcode by opcode,
// that is small as bytes but large as data because it names memoized
// objects again and again (the opcode BINGET, 'h', two bytes a
// reference). The pickles are well formed: what they test is the
// reader's budget, not its parsing of broken input. The package imports
// nothing of gpumem's.
package pickletest

import "bytes"

// BinUnicode is the pickle opcode BINUNICODE of s.
func BinUnicode(s string) []byte {
	return append([]byte{'X', byte(len(s)), byte(len(s) >> 8), 0, 0}, s...)
}

// SelfRefSettings returns a snapshot whose allocator_settings is a list
// that holds itself n times (n a multiple of 1,000), through the memo:
// two bytes an element.
func SelfRefSettings(n int) []byte {
	p := []byte{0x80, 2, '}', '('}
	p = append(p, BinUnicode("device_traces")...)
	p = append(p, "]]a"...)
	p = append(p, BinUnicode("allocator_settings")...)
	p = append(p, "]q\x00"...)
	chunk := append(append([]byte{'('}, bytes.Repeat([]byte("h\x00"), 1000)...), 'e')
	for range n / 1000 {
		p = append(p, chunk...)
	}
	return append(p, "u."...)
}

// MemoTraces returns a snapshot whose device_traces[0] holds n entries
// (n even): one alloc dict and one free_completed dict, named again and
// again through the memo at two bytes an entry.
func MemoTraces(n int) []byte {
	entry := func(action string) []byte {
		d := []byte{'}', '('}
		d = append(d, BinUnicode("action")...)
		d = append(d, BinUnicode(action)...)
		d = append(d, BinUnicode("addr")...)
		d = append(d, 'M', 0, 0x10)
		d = append(d, BinUnicode("size")...)
		d = append(d, 'M', 0, 2)
		d = append(d, BinUnicode("stream")...)
		d = append(d, 'K', 0, 'u')
		return d
	}
	p := []byte{0x80, 2, '}', '('}
	p = append(p, BinUnicode("device_traces")...)
	p = append(p, "]]"...)
	p = append(p, entry("alloc")...)
	p = append(p, "q\x01a"...)
	p = append(p, entry("free_completed")...)
	p = append(p, "q\x02a"...)
	for left := n - 2; left > 0; {
		k := min(left, 1000)
		p = append(p, '(')
		p = append(p, bytes.Repeat([]byte("h\x01h\x02"), k/2)...)
		p = append(p, 'e')
		left -= k
	}
	p = append(p, 'a')
	p = append(p, BinUnicode("segments")...)
	return append(p, "]u."...)
}
