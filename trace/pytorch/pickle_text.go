// This file holds the decoders of protocol 0's text strings: Python's
// escape_decode (STRING) and raw-unicode-escape (UNICODE).

package pytorch

import (
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"
)

// escapeDecode decodes the body of a quoted Python bytes literal, as
// codecs.escape_decode does: \\ \' \" \a \b \f \n \r \t \v, \ and a
// newline (nothing), one to three octal digits, \x and two hex digits; a
// backslash before anything else stays.
func escapeDecode(b []byte) (string, error) {
	var out strings.Builder
	out.Grow(len(b))
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c != '\\' {
			out.WriteByte(c)
			continue
		}
		i++
		if i == len(b) {
			return "", errors.New(`a trailing \ in a string`)
		}
		switch c = b[i]; c {
		case '\n':
		case '\\', '\'', '"':
			out.WriteByte(c)
		case 'a':
			out.WriteByte(7)
		case 'b':
			out.WriteByte(8)
		case 'f':
			out.WriteByte(12)
		case 'n':
			out.WriteByte('\n')
		case 'r':
			out.WriteByte('\r')
		case 't':
			out.WriteByte('\t')
		case 'v':
			out.WriteByte(11)
		case '0', '1', '2', '3', '4', '5', '6', '7':
			v := 0
			for n := 0; n < 3 && i < len(b) && b[i] >= '0' && b[i] <= '7'; n++ {
				v = v*8 + int(b[i]-'0')
				i++
			}
			i--
			out.WriteByte(byte(v))
		case 'x':
			if i+2 >= len(b) {
				return "", errors.New(`an invalid \x escape in a string`)
			}
			v, err := strconv.ParseUint(string(b[i+1:i+3]), 16, 8)
			if err != nil {
				return "", errors.New(`an invalid \x escape in a string`)
			}
			out.WriteByte(byte(v))
			i += 2
		default:
			out.WriteByte('\\')
			out.WriteByte(c)
		}
	}
	return out.String(), nil
}

// rawUnicodeDecode decodes raw-unicode-escape text: \uXXXX and
// \UXXXXXXXX are code points, every other byte is the Latin-1 character
// of its value.
func rawUnicodeDecode(b []byte) string {
	var out strings.Builder
	out.Grow(len(b))
	for i := 0; i < len(b); i++ {
		if b[i] == '\\' && i+1 < len(b) && (b[i+1] == 'u' || b[i+1] == 'U') {
			n := 4
			if b[i+1] == 'U' {
				n = 8
			}
			if i+2+n <= len(b) {
				if v, err := strconv.ParseUint(string(b[i+2:i+2+n]), 16, 32); err == nil && utf8.ValidRune(rune(v)) {
					out.WriteRune(rune(v))
					i += 1 + n
					continue
				}
			}
		}
		out.WriteRune(rune(b[i]))
	}
	return out.String()
}
