// Package simtest builds the simulated devices of gpumem's own tests: one
// place for the options they use (capacity, ordinal, page size, no
// simulated time), for a test's failure when a device cannot be built,
// for the streams a test runs on, and for the opener a Manager takes.
//
// # Model
//
// New applies its options, in order, to a zero sim.Config (every field at
// sim's default) and builds the device; a configuration sim refuses fails
// the test with t.Fatalf. The package imports only device and device/sim,
// so that every test can use it: the allocator's internal tests (which
// cannot import gpumemtest, since gpumemtest imports the allocator),
// gpumemtest's fixture, which builds its device here, and the tests of
// the packages above.
package simtest

import (
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
)

// TB is the part of testing.TB that New uses.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Option sets a field of the device's configuration.
type Option func(*sim.Config)

// Config sets the whole configuration; options after it change single
// fields of it.
func Config(cfg sim.Config) Option { return func(c *sim.Config) { *c = cfg } }

// Capacity sets the device's memory in bytes (0: sim.DefaultCapacity).
func Capacity(bytes uint64) Option { return func(c *sim.Config) { c.Capacity = bytes } }

// Ordinal sets the device's ordinal.
func Ordinal(o int) Option { return func(c *sim.Config) { c.Ordinal = o } }

// PageSize sets the allocation page and virtual-memory granularity.
func PageSize(bytes uint64) Option { return func(c *sim.Config) { c.PageSize = bytes } }

// HostCapacity bounds the pinned host memory live at once.
func HostCapacity(bytes uint64) Option { return func(c *sim.Config) { c.HostCapacity = bytes } }

// Costs sets the simulated time of each call (see sim.Config.Costs).
func Costs(c sim.Costs) Option { return func(cfg *sim.Config) { cfg.Costs = c } }

// NoCosts makes every call cost no simulated time (sim.NoCosts).
func NoCosts() Option { return func(c *sim.Config) { c.Costs = sim.NoCosts() } }

// Apply returns the configuration the options give.
func Apply(opts ...Option) sim.Config {
	var cfg sim.Config
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	return cfg
}

// New returns a simulated device built with the options, or fails the
// test (t.Fatalf) if sim refuses the configuration.
func New(t TB, opts ...Option) *sim.Device {
	t.Helper()
	dev, err := sim.New(Apply(opts...))
	if err != nil {
		t.Fatalf("simtest: simulated device: %v", err)
		return nil
	}
	return dev
}

// Opener returns a function that builds the device of an ordinal with
// the options, as allocator.NewManager takes it; the ordinal overrides any
// Ordinal option. A refused configuration is its error, with a nil
// Device.
func Opener(opts ...Option) func(ordinal int) (device.Device, error) {
	return func(ordinal int) (device.Device, error) {
		cfg := Apply(opts...)
		cfg.Ordinal = ordinal
		dev, err := sim.New(cfg)
		if err != nil {
			return nil, err
		}
		return dev, nil
	}
}

// Streams returns the default stream followed by n new streams of dev,
// or fails the test (t.Fatalf) if dev cannot make one.
func Streams(t TB, dev *sim.Device, n int) []device.Stream {
	t.Helper()
	streams := make([]device.Stream, 1, n+1)
	streams[0] = device.DefaultStream
	for range n {
		s, err := dev.NewStream()
		if err != nil {
			t.Fatalf("simtest: stream %d of %d: %v", len(streams), n, err)
			return nil
		}
		streams = append(streams, s)
	}
	return streams
}
