package allocator

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

// TestManagerDevicesListsOpenable: a Manager that knows the machine's devices
// lists them all before any is opened, and refuses an ordinal beyond them
// without opening anything.
func TestManagerDevicesListsOpenable(t *testing.T) {
	var opened []int
	m, err := NewManagerCount(3, simOpener(t, &opened), Config{})
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1, 2}, m.Devices(), "every device it can open, none opened yet")
	assert.Empty(t, m.Opened())

	_, err = m.Alloc(2, mib, 0)
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1, 2}, m.Devices())
	assert.Equal(t, []int{2}, m.Opened())

	_, err = m.Alloc(3, mib, 0)
	assert.ErrorIs(t, err, device.ErrInvalidArgument)
	assert.ErrorContains(t, err, "out of range 0..2")
	assert.Equal(t, []int{2}, opened, "the ordinal beyond the machine is not opened")

	// The totals and EmptyCache cover the opened devices only.
	total := m.TotalStats()
	assert.Equal(t, int64(mib), total.Allocated())
	require.NoError(t, m.EmptyCache())

	for _, n := range []int{0, -1, MaxDevices + 1} {
		_, err := NewManagerCount(n, simOpener(t, nil), Config{})
		assert.ErrorIs(t, err, device.ErrInvalidArgument, "%d devices", n)
	}

	// Without a count, the Manager knows only what it opened.
	m, err = NewManager(simOpener(t, nil), Config{})
	require.NoError(t, err)
	assert.Empty(t, m.Devices())
	_, err = m.Alloc(5, mib, 0)
	require.NoError(t, err)
	assert.Equal(t, []int{5}, m.Devices())
	assert.Equal(t, m.Devices(), m.Opened())
}
