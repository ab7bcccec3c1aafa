package tracetest

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/gpumem/gpumem/trace"
)

// fakeTB records fatal messages and, unlike testing.T, returns from Fatalf.
type fakeTB struct{ fatals []string }

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.fatals = append(f.fatals, fmt.Sprintf(format, args...))
}

func TestLive(t *testing.T) {
	ops := []trace.Op{
		{Kind: trace.Alloc, ID: 1, Size: 512},
		{Kind: trace.Alloc, ID: 2, Size: 512},
		{Kind: trace.Free, ID: 1},
	}
	var f fakeTB
	assert.Equal(t, 1, Live(&f, ops))
	assert.Empty(t, f.fatals)

	bad := append(ops, trace.Op{Kind: trace.Free, ID: 1}) // freed twice
	assert.Equal(t, 1, Live(&f, bad))
	if assert.Len(t, f.fatals, 1) {
		assert.Contains(t, f.fatals[0], "op 4 of 4")
	}
}

func TestGzip(t *testing.T) {
	var f fakeTB
	ops, err := trace.ReadAll(bytes.NewReader(Gzip(&f, "# memtrace v1\na 1 512 0\nf 1\n")))
	assert.NoError(t, err)
	assert.Len(t, ops, 2)
	assert.Empty(t, f.fatals)
}

func TestReadFile(t *testing.T) {
	var f fakeTB
	assert.Nil(t, ReadFile(&f, "no such file"))
	if assert.Len(t, f.fatals, 1) {
		assert.Contains(t, f.fatals[0], "no such file")
	}
}
