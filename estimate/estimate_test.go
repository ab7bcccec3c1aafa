package estimate

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/trace"
)

var small = Model{Layers: 2, Hidden: 64, Heads: 4, Vocab: 1000, Seq: 128, Batch: 4, Bytes: 4, Optimizer: Adam}

func TestParamsAndBreakdown(t *testing.T) {
	m := Model{Layers: 12, Hidden: 768, Heads: 12, Vocab: 50257, Seq: 1024, Batch: 8, Bytes: 2, Optimizer: Adam}
	h, l, v := int64(768), int64(12), int64(50257)
	assert.Equal(t, v*h+l*(12*h*h+13*h), m.Params(), "embedding plus 12h^2+13h per layer")
	b := m.Breakdown()
	assert.Equal(t, 2*m.Params(), b.Parameters)
	assert.Equal(t, b.Parameters, b.Gradients)
	assert.Equal(t, 2*b.Parameters, b.OptimizerState, "Adam keeps two states")
	assert.Equal(t, b.Parameters+b.Gradients+b.OptimizerState+b.Activations, b.Total)
	m.Optimizer = SGD
	assert.Zero(t, m.Breakdown().OptimizerState)
	m.Optimizer = SGDMomentum
	assert.Equal(t, m.Breakdown().Parameters, m.Breakdown().OptimizerState)
}

func TestWorkloadIsAValidTrace(t *testing.T) {
	w, err := NewWorkload(small)
	require.NoError(t, err)
	ops := w.Setup()
	for range 3 {
		ops = append(ops, w.Step()...)
	}
	v := trace.NewValidator()
	for i, op := range ops {
		_, err := v.Check(op, i+1)
		require.NoError(t, err)
	}
	tensors := len(small.paramSizes())
	assert.Equal(t, tensors*(1+Adam.states()), v.Live(), "parameters and optimizer state stay; everything else is freed")
}

func TestSimulate(t *testing.T) {
	r, err := Simulate(small, 1<<30, allocator.Config{}, 3)
	require.NoError(t, err)
	assert.True(t, r.Fits)
	assert.Zero(t, r.Replay.OOMs)
	assert.GreaterOrEqual(t, r.Replay.PeakReserved, r.Replay.PeakAllocated)
	assert.Equal(t, int64(1<<30)-r.Replay.PeakReserved, r.Headroom)
	assert.Positive(t, r.Replay.DeviceAllocs)

	tiny, err := Simulate(small, 8<<20, allocator.Config{}, 2)
	require.NoError(t, err)
	assert.False(t, tiny.Fits)
	assert.Positive(t, tiny.Replay.OOMs)

	_, err = Simulate(small, 1<<30, allocator.Config{}, 0)
	assert.Error(t, err)
}

func TestMaxBatch(t *testing.T) {
	capacity := uint64(256 << 20)
	n, err := MaxBatch(small, capacity, allocator.Config{}, 1024)
	require.NoError(t, err)
	require.Positive(t, n)
	fit := func(b int) bool {
		m := small
		m.Batch = b
		r, err := Simulate(m, capacity, allocator.Config{}, 2)
		require.NoError(t, err)
		return r.Fits
	}
	assert.True(t, fit(n))
	assert.False(t, fit(n+1))
	none, err := MaxBatch(small, 2<<20, allocator.Config{}, 1024)
	require.NoError(t, err)
	assert.Zero(t, none)
}

func TestValidate(t *testing.T) {
	require.NoError(t, small.Validate())
	for _, bad := range []func(*Model){
		func(m *Model) { m.Layers = 0 },
		func(m *Model) { m.Heads = 3 },
		func(m *Model) { m.Bytes = 8 },
		func(m *Model) { m.Batch = -1 },
		func(m *Model) { m.Optimizer = 9 },
		func(m *Model) { m.Seq, m.Batch, m.Heads, m.Hidden = 1<<20, 1<<20, 64, 1<<12 },
	} {
		m := small
		bad(&m)
		assert.Error(t, m.Validate(), "%+v", m)
		_, err := NewWorkload(m)
		assert.Error(t, err)
	}
	_, err := ParseOptimizer("rmsprop")
	assert.Error(t, err)
	o, err := ParseOptimizer("AdamW")
	require.NoError(t, err)
	assert.Equal(t, Adam, o)
}
