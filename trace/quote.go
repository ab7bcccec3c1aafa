// This file holds Excerpt and Quote, the bounded views of input that the
// error messages of every parser in this module show.

package trace

import (
	"strconv"
	"unicode/utf8"
)

// MaxQuote is the most bytes of an input that an error message of this
// module's parsers (memtrace, PyTorch snapshots, RMM logs, conversion)
// repeats: however long a bad line or field is, its message stays short.
const MaxQuote = 100

// Excerpt returns s whole when it is at most MaxQuote bytes long, and
// otherwise its first MaxQuote bytes or fewer, cut at the start of a UTF-8
// sequence, followed by "...".
func Excerpt[T string | []byte](s T) string {
	if len(s) <= MaxQuote {
		return string(s)
	}
	n := MaxQuote
	for i := 0; i < utf8.UTFMax && n > 0 && !utf8.RuneStart(s[n]); i++ {
		n--
	}
	return string(s[:n]) + "..."
}

// Quote returns Excerpt(s) as a double-quoted Go string literal, for an
// error message, followed by the length of s in bytes when it was cut:
// "abc" or "abcd..." (1048576 bytes).
func Quote[T string | []byte](s T) string {
	q := strconv.Quote(Excerpt(s))
	if len(s) > MaxQuote {
		q += " (" + strconv.Itoa(len(s)) + " bytes)"
	}
	return q
}
