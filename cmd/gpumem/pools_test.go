package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReplayJSONPools: replay --json reports each pool the trace made and
// did not drop; the baseline stops at the first pool line, naming it.
func TestReplayJSONPools(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pools.trace")
	require.NoError(t, os.WriteFile(path, []byte("# memtrace v1 source=test\nP kv no_split\nP gone\nu kv 0\na 0 4096 0\nu - 0\na 1 1048576 0\nz kv\nd gone\n"), 0o644))
	res := runJSON(t, "replay", "--conf", "expandable_segments:True", path)
	assert.Equal(t, map[string]any{"kv": map[string]any{
		"allocated_bytes": float64(2 << 20), "reserved_bytes": float64(2 << 20), "peak_reserved_bytes": float64(2 << 20), "paused": true,
	}}, res["pools"])
	_, errOut, code := runCmd(t, "replay", "--baseline", path)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, `memtrace line 2: "P kv no_split": the replayed allocator keeps no pools`)
}

// TestReplayPoolsNeedTheCachingAllocator: the async backend, like the
// baseline, stops at the first pool line, and the error says what to use.
func TestReplayPoolsNeedTheCachingAllocator(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pools.trace")
	require.NoError(t, os.WriteFile(path, []byte("# memtrace v1 source=test\na 0 4096 0\nP kv\n"), 0o644))
	_, errOut, code := runCmd(t, "replay", "--conf", "backend:cudaMallocAsync", path)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, `memtrace line 3: "P kv": the replayed allocator keeps no pools: pool lines need the caching allocator`)
}
