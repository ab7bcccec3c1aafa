package allocator

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/internal/simtest"
)

func simOpener(t testing.TB, opened *[]int) func(int) (device.Device, error) {
	var mu sync.Mutex
	return func(o int) (device.Device, error) {
		mu.Lock()
		defer mu.Unlock()
		if opened != nil {
			*opened = append(*opened, o)
		}
		return simtest.Opener(simtest.Capacity(8 * gib))(o)
	}
}

func TestManagerPerDevice(t *testing.T) {
	var opened []int
	m, err := NewManager(simOpener(t, &opened), Config{})
	require.NoError(t, err)
	assert.Empty(t, m.Devices(), "devices open lazily")

	p0, err := m.Alloc(0, 3*mib, 0)
	require.NoError(t, err)
	p1, err := m.Alloc(1, 5*mib, 0)
	require.NoError(t, err)
	assert.NotEqual(t, p0, p1, "each device has its own address range")
	assert.Equal(t, []int{0, 1}, m.Devices())
	assert.Equal(t, []int{0, 1}, opened)

	assert.ErrorIs(t, m.Free(1, p0), device.ErrInvalidPointer, "a pointer of device 0 is not a block of device 1")
	assert.ErrorIs(t, m.Free(2, p0), device.ErrInvalidPointer, "device 2 was never used")
	assert.Equal(t, []int{0, 1}, m.Devices(), "freeing on an unused device does not open it")
	assert.ErrorIs(t, m.Free(-1, p0), device.ErrInvalidArgument)
	_, err = m.Alloc(MaxDevices, 1, 0)
	assert.ErrorIs(t, err, device.ErrInvalidArgument)

	a1, err := m.Allocator(1)
	require.NoError(t, err)
	s, err := a1.Device().NewStream()
	require.NoError(t, err)
	assert.ErrorIs(t, m.RecordStream(0, p0, s), device.ErrInvalidStream, "a stream of device 1 is not a stream of device 0")
	require.NoError(t, m.RecordStream(1, p1, s))

	assert.EqualValues(t, 3*mib, m.Stats(0).Allocated())
	assert.EqualValues(t, 5*mib, m.Stats(1).Allocated())
	assert.EqualValues(t, 0, m.Stats(5).Allocated())
	total := m.TotalStats()
	assert.EqualValues(t, 8*mib, total.Allocated())
	assert.EqualValues(t, 40*mib, total.Reserved())
	assert.EqualValues(t, 2, total.NumDeviceAlloc)

	sum, err := m.Summary(1, true)
	require.NoError(t, err)
	assert.Contains(t, sum, "device 1")
	_, err = m.Summary(3, false)
	assert.Error(t, err)

	require.NoError(t, m.Free(0, p0))
	require.NoError(t, m.Free(1, p1))
	require.NoError(t, m.EmptyCache())
	assert.EqualValues(t, 0, m.TotalStats().Reserved())
}

func TestManagerOpenErrors(t *testing.T) {
	_, err := NewManager(nil, Config{})
	assert.Error(t, err)
	_, err = NewManager(simOpener(t, nil), Config{MaxSplitSize: 1})
	assert.Error(t, err)
	boom := errors.New("no such GPU")
	m, err := NewManager(func(o int) (device.Device, error) {
		if o == 3 {
			return nil, boom
		}
		return simtest.Opener()(o + 1)
	}, Config{})
	require.NoError(t, err)
	_, err = m.Alloc(3, 10, 0)
	assert.ErrorIs(t, err, boom)
	_, err = m.Alloc(0, 10, 0)
	assert.ErrorContains(t, err, "gave device 1")
	assert.Empty(t, m.Devices())
}

// TestManagerConcurrentDevices runs goroutines on two devices and two
// streams each (run with -race).
func TestManagerConcurrentDevices(t *testing.T) {
	var opened []int
	m, err := NewManager(simOpener(t, &opened), Config{})
	require.NoError(t, err)
	var eg errgroup.Group
	for g := range 8 {
		eg.Go(func() error {
			o := g % 2
			a, err := m.Allocator(o)
			if err != nil {
				return err
			}
			s := device.DefaultStream
			if g%4 >= 2 {
				if s, err = a.Device().NewStream(); err != nil {
					return err
				}
			}
			var live []device.Ptr
			for i := range 1000 {
				p, err := m.Alloc(o, uint64(i%97+1)*37*kib, s)
				if err != nil {
					return err
				}
				live = append(live, p)
				if len(live) > 20 {
					if err := m.Free(o, live[0]); err != nil {
						return err
					}
					live = live[1:]
				}
			}
			for _, p := range live {
				if err := m.Free(o, p); err != nil {
					return err
				}
			}
			return nil
		})
	}
	require.NoError(t, eg.Wait())
	assert.Len(t, opened, 2, "each device opened once")
	for _, o := range m.Devices() {
		a, _ := m.Allocator(o)
		require.NoError(t, a.CheckInvariants())
	}
	assert.EqualValues(t, 0, m.TotalStats().Allocated())
}
