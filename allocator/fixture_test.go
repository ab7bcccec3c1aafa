// fixture_test.go: how the package's own tests build their devices and
// allocators. The device comes from internal/simtest, which gpumemtest's
// fixture builds on too; these tests cannot import gpumemtest, which
// imports this package.

package allocator

import (
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/simtest"
)

// newOn returns an allocator with cfg on a new simulated device built with
// the options, and fails the test if either cannot be built. Nothing is
// checked when the test ends; newTest adds that.
func newOn(t simtest.TB, cfg Config, opts ...simtest.Option) (*Allocator, *sim.Device) {
	t.Helper()
	dev := simtest.New(t, opts...)
	return onDevice(t, dev, cfg), dev
}

// onDevice returns an allocator with cfg on d, a device the test built (a
// simulated one seen through a wrapper or with fewer capabilities), and
// fails the test if it cannot be built.
func onDevice(t simtest.TB, d device.Device, cfg Config) *Allocator {
	t.Helper()
	a, err := New(d, cfg)
	if err != nil {
		t.Fatalf("allocator: %v", err)
	}
	return a
}
