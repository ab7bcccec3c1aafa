package gorgonia

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/tensor"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/gpumemtest"
)

// The engine must be what tensor takes it for.
var (
	_ tensor.Engine       = (*Engine)(nil)
	_ tensor.NonStdEngine = (*Engine)(nil)
	_ tensor.Memory       = Block{}
)

func newEngine(t *testing.T, capacity uint64, ops Memops) (*Engine, *sim.Device) {
	t.Helper()
	a := gpumemtest.New(t, gpumemtest.WithCapacity(capacity))
	dev := a.Device().(*sim.Device)
	s, err := dev.AdoptStreamHandle(0x5eed) // the runtime's stream
	require.NoError(t, err)
	e, err := New(a, s, ops)
	require.NoError(t, err)
	return e, dev
}

func current(e *Engine, key string) int64 {
	st := e.Allocator().Stats()
	return st.Map()[key]
}

func TestTensorsAllocateThroughGpumem(t *testing.T) {
	e, dev := newEngine(t, 1<<30, nil)
	x := tensor.New(tensor.WithShape(256, 256), tensor.Of(tensor.Float32), tensor.WithEngine(e))
	assert.True(t, x.IsManuallyManaged())
	assert.Equal(t, uintptr(256*256*4), x.MemSize())
	assert.Equal(t, int64(256*256*4), current(e, "allocated_bytes.all.current"))
	assert.Equal(t, int64(1), dev.Counters().Mallocs)
	first := x.Uintptr()
	require.NoError(t, e.Free(x, int64(x.MemSize())))
	assert.Zero(t, current(e, "allocated_bytes.all.current"))

	// The next tensor of the same size takes the cached block: no device call.
	y := tensor.New(tensor.WithShape(256, 256), tensor.Of(tensor.Float32), tensor.WithEngine(e))
	assert.Equal(t, first, y.Uintptr())
	assert.Equal(t, int64(1), dev.Counters().Mallocs)
	require.NoError(t, e.Free(y, int64(y.MemSize())))
	require.ErrorIs(t, e.Free(y, int64(y.MemSize())), device.ErrInvalidPointer, "double free")
	require.NoError(t, e.Free(nil, 0))
}

func TestAllocErrors(t *testing.T) {
	e, _ := newEngine(t, 64<<20, nil)
	_, err := e.Alloc(-1)
	require.ErrorIs(t, err, device.ErrInvalidSize)
	_, err = e.Alloc(1 << 30)
	var oom *allocator.OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	require.ErrorIs(t, err, device.ErrOutOfMemory)

	// tensor.New panics on an allocation error; the panic carries it.
	func() {
		defer func() {
			r := recover()
			require.NotNil(t, r)
			err, ok := r.(error)
			require.True(t, ok, "panic value %v", r)
			assert.True(t, errors.As(err, &oom))
		}()
		tensor.New(tensor.WithShape(1<<28), tensor.Of(tensor.Float32), tensor.WithEngine(e))
	}()
	assert.Zero(t, current(e, "allocated_bytes.all.current"))

	_, err = New(nil, 0, nil)
	require.ErrorIs(t, err, device.ErrInvalidArgument)
}

func TestMemopsAbsent(t *testing.T) {
	e, _ := newEngine(t, 1<<30, nil)
	m, err := e.Alloc(1024)
	require.NoError(t, err)
	require.ErrorIs(t, e.Memset(m, float32(1)), device.ErrNotSupported)
	require.ErrorIs(t, e.Memcpy(m, m), device.ErrNotSupported)
	require.NoError(t, e.Err())
	e.Memclr(m)
	require.ErrorIs(t, e.Err(), device.ErrNotSupported)
	require.NoError(t, e.Err(), "Err forgets")
	_, err = e.Accessible(m)
	require.ErrorIs(t, err, ErrNotAccessible)
	assert.False(t, e.AllocAccessible())
	require.NoError(t, e.Free(m, 1024))
}

// recorder is a Memops that records what it was asked to do.
type recorder struct {
	calls []string
	fail  error
}

func (r *recorder) Memset(p device.Ptr, n uint64, pattern []byte, s device.Stream) error {
	r.calls = append(r.calls, fmt.Sprintf("memset %v %d %q %d", p, n, pattern, s))
	return r.fail
}

func (r *recorder) Memcpy(dst, src device.Ptr, n uint64, s device.Stream) error {
	r.calls = append(r.calls, "memcpy")
	return r.fail
}

func TestMemops(t *testing.T) {
	rec := &recorder{}
	e, _ := newEngine(t, 1<<30, rec)
	m, err := e.Alloc(8)
	require.NoError(t, err)
	require.NoError(t, e.Memset(m, float32(1)))
	want := fmt.Sprintf("memset %v 8 %q %d", m.(Block).Ptr, []byte{0, 0, 0x80, 0x3f}, e.Stream())
	assert.Equal(t, want, rec.calls[0], "the float's bytes, on the engine's stream")
	require.ErrorIs(t, e.Memset(m, complex64(1)), device.ErrInvalidArgument)
	odd, err := e.Alloc(6)
	require.NoError(t, err)
	require.ErrorIs(t, e.Memset(odd, float32(1)), device.ErrInvalidArgument, "6 bytes are not whole float32s")
	require.NoError(t, e.Memcpy(m, odd))
	e.Memclr(m)
	require.NoError(t, e.Err())
	assert.Len(t, rec.calls, 3)

	rec.fail = errors.New("kernel launch failed")
	e.Memclr(m)
	require.ErrorIs(t, e.Err(), rec.fail)
	require.NoError(t, e.Free(m, 8))
	require.NoError(t, e.Free(odd, 6))
}
