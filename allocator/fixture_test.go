// fixture_test.go: how the package's own tests build their devices and
// allocators, and the helpers they share (newTest, mustAlloc, mustFree,
// mustPool, inBackground, get). The device comes from internal/simtest, which gpumemtest's
// fixture builds on too; these tests cannot import gpumemtest, which
// imports this package.

package allocator

import (
	"testing"

	"github.com/stretchr/testify/require"

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

const (
	kib = 1 << 10
	gib = 1 << 30
)

// newTest returns an allocator on a fresh simulated device of the given
// capacity (0: the default 80 GiB) and checks its invariants when the test
// ends.
func newTest(t testing.TB, capacity uint64, cfg Config) (*Allocator, *sim.Device) {
	t.Helper()
	a, dev := newOn(t, cfg, simtest.Capacity(capacity))
	t.Cleanup(func() {
		if err := a.CheckInvariants(); err != nil {
			t.Errorf("invariants at the end: %v", err)
		}
	})
	return a, dev
}

func mustAlloc(t testing.TB, a *Allocator, size uint64, s device.Stream) device.Ptr {
	t.Helper()
	p, err := a.Alloc(size, s)
	require.NoError(t, err)
	require.NoError(t, a.CheckInvariants())
	return p
}

// mustPool makes the pool name on a.
func mustPool(t testing.TB, a *Allocator, name string, opts PoolOptions) *Pool {
	t.Helper()
	p, err := a.NewPool(name, opts)
	require.NoError(t, err)
	return p
}

// mustFree frees the blocks, in order, checking the invariants after
// each.
func mustFree(t testing.TB, a *Allocator, ps ...device.Ptr) {
	t.Helper()
	for _, p := range ps {
		require.NoError(t, a.Free(p))
		require.NoError(t, a.CheckInvariants())
	}
}

// inBackground calls f over and over in a goroutine of its own until the
// stop it returns is called; stop returns once the goroutine has, so that
// nothing of f runs after it.
func inBackground(f func()) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			default:
				f()
			}
		}
	}()
	return func() { close(quit); <-done }
}

func get(t testing.TB, a *Allocator, key string) int64 {
	t.Helper()
	st := a.Stats()
	v, ok := st.Get(key)
	require.True(t, ok, "stat %q exists", key)
	return v
}
