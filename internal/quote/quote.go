// Package quote bounds what an error message repeats of its input: the
// configuration parsers of the allocator and of the estimator, and the
// command line, quote at most Max bytes of a value, however long the
// value is, so that a 5 MB argument makes a message of about a hundred
// bytes, not of 5 MB. (The trace parsers have trace.Quote, the same rule
// in a package that imports nothing of the module.)
package quote

import (
	"strconv"
	"unicode/utf8"
)

// Max is the most bytes of a value that Quote repeats.
const Max = 100

// Quote returns s as a double-quoted Go string literal (control
// characters and invalid UTF-8 escaped, so nothing raw reaches a
// terminal) when it is at most Max bytes long; otherwise its first Max
// bytes or fewer, cut at the start of a UTF-8 sequence, quoted with "..."
// inside the quotes and followed by the length: "abcd..." (1048576 bytes).
func Quote(s string) string {
	if len(s) <= Max {
		return strconv.Quote(s)
	}
	n := Max
	for i := 0; i < utf8.UTFMax && n > 0 && !utf8.RuneStart(s[n]); i++ {
		n--
	}
	return strconv.Quote(s[:n]+"...") + " (" + strconv.Itoa(len(s)) + " bytes)"
}
