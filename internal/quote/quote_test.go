package quote

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestQuote(t *testing.T) {
	cases := []struct{ in, want string }{
		{"", `""`},
		{"llama", `"llama"`},
		{"a\nb\x1b[31m", `"a\nb\x1b[31m"`},
		{strings.Repeat("x", Max), `"` + strings.Repeat("x", Max) + `"`},
		{strings.Repeat("x", Max+1), `"` + strings.Repeat("x", Max) + `..." (101 bytes)`},
	}
	for _, c := range cases {
		if got := Quote(c.in); got != c.want {
			t.Errorf("Quote(%.20q) = %s, want %s", c.in, got, c.want)
		}
	}
}

// A long value is cut at a character boundary, and the message stays
// short however long the value.
func TestQuoteLongValues(t *testing.T) {
	for _, s := range []string{strings.Repeat("é", 3_000_000), strings.Repeat("\n", 5<<20), strings.Repeat("日本", 100)} {
		q := Quote(s)
		if len(q) > 4*Max+40 {
			t.Errorf("Quote of %d bytes is %d bytes long", len(s), len(q))
		}
		if !utf8.ValidString(q) || strings.Contains(q, "\uFFFD") {
			t.Errorf("Quote cut a character: %s", q)
		}
	}
}
