package trace

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestQuote(t *testing.T) {
	assert.Equal(t, `"a b"`, Quote("a b"))
	assert.Equal(t, `"\x00\n"`, Quote([]byte{0, '\n'}))
	long := strings.Repeat("x", 10<<20)
	q := Quote(long)
	assert.Equal(t, `"`+strings.Repeat("x", MaxQuote)+`..." (10485760 bytes)`, q)
	assert.Equal(t, strings.Repeat("x", MaxQuote)+"...", Excerpt(long))

	// A cut never splits a UTF-8 sequence.
	s := strings.Repeat("x", MaxQuote-1) + "é" + "tail"
	assert.Equal(t, strings.Repeat("x", MaxQuote-1)+"...", Excerpt(s))
	assert.Equal(t, s[:MaxQuote], Excerpt(s[:MaxQuote]), "exactly MaxQuote bytes is not cut")
}
