package trace

import (
	"compress/gzip"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ReadFile reads a gzip file as ReadAll reads its decompressed text, and
// says which file it could not open.
func TestReadFile(t *testing.T) {
	const path = "testdata/bert_b2.trace.gz"
	ops, err := ReadFile(path)
	require.NoError(t, err)
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	z, err := gzip.NewReader(f)
	require.NoError(t, err)
	want, err := ReadAll(z)
	require.NoError(t, err)
	assert.Equal(t, want, ops)
	assert.Len(t, ops, 7251)

	missing := filepath.Join(t.TempDir(), "none.trace")
	_, err = ReadFile(missing)
	assert.ErrorIs(t, err, os.ErrNotExist)
	assert.ErrorContains(t, err, missing)

	bad := filepath.Join(t.TempDir(), "bad.trace")
	require.NoError(t, os.WriteFile(bad, []byte("# memtrace v1\na 1 zz 0\n"), 0o644))
	_, err = ReadFile(bad)
	assert.Error(t, err, "a malformed line is an error, not the end")
}
