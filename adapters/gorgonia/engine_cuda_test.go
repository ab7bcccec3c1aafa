//go:build cuda

package gorgonia

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/tensor"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device/cuda"
)

// Tensors on the CUDA backend: with the stub driver (scripts/ci-cuda.sh
// puts it on LD_LIBRARY_PATH) or a GPU (scripts/gpu-check.sh). Device memory
// is never read from Go, so the stub serves as well as a card.
func TestCUDATensors(t *testing.T) {
	if !cuda.Available() {
		_, err := cuda.DeviceCount()
		t.Skipf("no CUDA device: %v", err)
	}
	dev, err := cuda.Open(0)
	require.NoError(t, err)
	defer func() { _ = dev.Close() }()
	s, err := dev.NewStream() // the runtime's stream
	require.NoError(t, err)
	a, err := allocator.New(dev, allocator.Config{})
	require.NoError(t, err)
	e, err := New(a, s, nil)
	require.NoError(t, err)

	x := tensor.New(tensor.WithShape(512, 512), tensor.Of(tensor.Float32), tensor.WithEngine(e))
	first := x.Uintptr()
	require.NoError(t, e.Free(x, int64(x.MemSize())))
	y := tensor.New(tensor.WithShape(512, 512), tensor.Of(tensor.Float32), tensor.WithEngine(e))
	assert.Equal(t, first, y.Uintptr(), "the cached block is reused")
	require.NoError(t, e.Free(y, int64(y.MemSize())))
	st := a.Stats()
	assert.Equal(t, int64(1), st.Map()["num_device_alloc"])
	require.NoError(t, a.EmptyCache())
}
