package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReplayAsyncBackend: --conf backend:cudaMallocAsync replays on the
// simulated device's stream-ordered pool: the stats are the pool's
// (allocated and reserved, no device mallocs counted), and the options
// that need the caching allocator are refused in one line.
func TestReplayAsyncBackend(t *testing.T) {
	native := runJSON(t, "replay", "--conf", "", "testdata/small.trace.gz")
	async := runJSON(t, "replay", "--conf", "backend:cudaMallocAsync", "testdata/small.trace.gz")
	assert.Equal(t, native["allocs"], async["allocs"])
	assert.Equal(t, native["ooms"], async["ooms"])
	st := async["stats"].(map[string]any)
	assert.Positive(t, st["allocated_bytes.all.peak"])
	assert.Positive(t, st["reserved_bytes.all.peak"])
	assert.GreaterOrEqual(t, st["reserved_bytes.all.peak"], st["allocated_bytes.all.peak"])
	assert.Zero(t, st["num_device_alloc"], "unfilled, as in PyTorch's backend")
	assert.Zero(t, st["requested_bytes.all.peak"], "unfilled, as in PyTorch's backend")
	assert.Positive(t, native["device_allocs"])
	assert.Zero(t, async["device_allocs"])

	for _, args := range [][]string{
		{"replay", "--conf", "backend:cudaMallocAsync", "--phases", "testdata/small.trace.gz"},
		{"replay", "--conf", "backend:cudaMallocAsync", "--snapshot", t.TempDir() + "/s.pickle", "testdata/small.trace.gz"},
		{"viz", "--conf", "backend:cudaMallocAsync", "testdata/small.trace.gz"},
	} {
		_, errOut, code := runCmd(t, args...)
		require.Equal(t, 2, code, "%v: %s", args, errOut)
		assert.Contains(t, errOut, "backend:cudaMallocAsync", "%v", args)
	}
	// The plain caching allocator's demo refuses the backend with a clear
	// error rather than ignoring it.
	_, errOut, code := runCmd(t, "demo", "--steps", "1", "--layers", "1", "--conf", "backend:cudaMallocAsync")
	require.NotEqual(t, 0, code)
	assert.Contains(t, errOut, "backend:cudaMallocAsync")
}
