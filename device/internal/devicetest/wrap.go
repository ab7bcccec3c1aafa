package devicetest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
)

// Wrap returns the device an adaptor under test gives over inner.
type Wrap func(inner device.Device) device.Device

// Faithful runs the script on each of the 256 capability subsets
// (Subsets) of a bare simulated device and, wrapped, on the same subset
// of a twin: the lines must be the same, and the two simulators' counters
// and clocks equal after each subset. check then sees the subset's index
// and the wrapped run's result, for the adaptor's own counts. newSim must
// return a fresh device of the same configuration at each call.
func Faithful(t *testing.T, newSim func() *sim.Device, wrap Wrap, check func(i int, got Result)) *sim.Device {
	t.Helper()
	bares, inners := newSim(), newSim()
	bareSubsets, innerSubsets := Subsets(bares), Subsets(inners)
	for i := range bareSubsets {
		want := Run(bareSubsets[i])
		got := Run(wrap(innerSubsets[i]))
		require.Equal(t, want.Lines, got.Lines, "subset %08b", i)
		require.Equal(t, bares.Counters(), inners.Counters(), "subset %08b", i)
		require.Equal(t, bares.Clock(), inners.Clock(), "subset %08b", i)
		check(i, got)
	}
	return inners
}

// SameCapabilities checks that the wrapped device offers exactly what
// the inner one offers, for each capability subset of newDev()'s: no
// capability appears by wrapping and none is lost.
func SameCapabilities(t *testing.T, newDev func() device.Device, wrap Wrap) {
	t.Helper()
	for i, inner := range Subsets(newDev()) {
		assert.Equal(t, Offered(inner), Offered(wrap(inner)), "subset %08b", i)
	}
}
