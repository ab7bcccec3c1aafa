// This file tests the helpers with a fake TB: they fail a test that
// leaks or goes over budget, with the figures, and pass a clean one.

package gpumemtest_test

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/gpumemtest"
	"github.com/gpumem/gpumem/stats"
)

const mib = 1 << 20

var (
	_ gpumemtest.TB = (*testing.T)(nil)
	_ gpumemtest.TB = (*testing.B)(nil)
	_ gpumemtest.TB = (*testing.F)(nil)
)

// fakeTB records what a helper reports, and runs the cleanups when the
// "test" ends.
type fakeTB struct {
	errors   []string
	fatals   []string
	cleanups []func()
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Errorf(format string, args ...any) {
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.fatals = append(f.fatals, fmt.Sprintf(format, args...))
}
func (f *fakeTB) Cleanup(fn func()) { f.cleanups = append(f.cleanups, fn) }

func (f *fakeTB) failed() bool { return len(f.errors)+len(f.fatals) > 0 }

// run runs test as a test function would run, then its cleanups.
func run(test func(t gpumemtest.TB)) *fakeTB {
	f := &fakeTB{}
	test(f)
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
	return f
}

func mustAlloc(t gpumemtest.TB, a *allocator.Allocator, size uint64) device.Ptr {
	p, err := a.Alloc(size, device.DefaultStream)
	if err != nil {
		t.Fatalf("alloc: %v", err)
	}
	return p
}

// The requirement: the helper fails a leaking test and passes a
// clean one.
func TestFixtureFailsLeakingTestPassesCleanOne(t *testing.T) {
	leaky := run(func(t gpumemtest.TB) {
		a := gpumemtest.New(t, gpumemtest.WithCapacity(1<<30))
		kept := mustAlloc(t, a, 3*mib)
		_ = mustAlloc(t, a, 100) // freed below
		p := mustAlloc(t, a, 5000)
		_ = a.Free(p)
		_ = kept
	})
	require.Len(t, leaky.errors, 1)
	msg := leaky.errors[0]
	assert.Contains(t, msg, "device 0: 2 blocks (3.00 MiB) still allocated:")
	assert.Contains(t, msg, "3.00 MiB (requested 3145728 bytes) large_pool, stream 0")
	assert.Contains(t, msg, "512 bytes (requested 100 bytes) small_pool, stream 0")
	assert.Less(t, strings.Index(msg, "3.00 MiB (requested"), strings.Index(msg, "512 bytes"), "largest first")
	assert.NotContains(t, msg, "allocated by phase", "no phases named")

	clean := run(func(t gpumemtest.TB) {
		a := gpumemtest.New(t, gpumemtest.WithCapacity(1<<30))
		p := mustAlloc(t, a, 3*mib)
		q := mustAlloc(t, a, 100)
		_ = a.Free(q)
		_ = a.Free(p)
	})
	assert.False(t, clean.failed(), "%v", clean.errors)
}

func TestDeferVerifyNoLeaks(t *testing.T) {
	a := gpumemtest.New(t, gpumemtest.WithDevice(sim.Config{Ordinal: 3}), gpumemtest.AllowLeaks())

	f := run(func(t gpumemtest.TB) {
		defer gpumemtest.VerifyNoLeaks(t, a)
		a.SetPhase("forward")
		mustAlloc(t, a, 2*mib)
		a.SetPhase("backward")
		mustAlloc(t, a, 6*mib)
	})
	require.Len(t, f.errors, 1)
	assert.Contains(t, f.errors[0], "device 3: 2 blocks (8.00 MiB) still allocated")
	assert.Contains(t, f.errors[0], `allocated by phase: "backward" 6.00 MiB, "forward" 2.00 MiB`)

	// The same allocator, its old blocks ignored: a clean test passes.
	f = run(func(t gpumemtest.TB) {
		defer gpumemtest.VerifyNoLeaks(t, a, gpumemtest.IgnoreCurrent(a))
		p := mustAlloc(t, a, 4*mib)
		_ = a.Free(p)
	})
	assert.False(t, f.failed(), "%v", f.errors)

	// ... and a leaking one is told only of its own block, without phases.
	f = run(func(t gpumemtest.TB) {
		defer gpumemtest.VerifyNoLeaks(t, a, gpumemtest.IgnoreCurrent(a))
		mustAlloc(t, a, 1*mib)
	})
	require.Len(t, f.errors, 1)
	assert.Contains(t, f.errors[0], "1 block (1024.00 KiB) still allocated")
	assert.NotContains(t, f.errors[0], "allocated by phase")
}

func TestFindLeaks(t *testing.T) {
	a := gpumemtest.New(t, gpumemtest.AllowLeaks())
	require.NoError(t, gpumemtest.FindLeaks(a))
	var ps []device.Ptr
	for i := range 25 {
		ps = append(ps, mustAlloc(t, a, uint64(i+1)*4096))
	}
	err := gpumemtest.FindLeaks(a)
	var le *gpumemtest.LeakError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, 0, le.Device)
	require.Len(t, le.Blocks, 25)
	assert.EqualValues(t, 25*4096, le.Blocks[0].Size)
	assert.Equal(t, stats.SmallPool, le.Blocks[0].Pool)
	var sum uint64
	for _, b := range le.Blocks {
		sum += b.Size
	}
	assert.Equal(t, sum, le.Bytes)
	assert.EqualValues(t, a.Stats().Allocated(), le.Bytes)
	assert.Contains(t, err.Error(), "... and 5 more (60.00 KiB)", "the five smallest: 4+8+12+16+20 KiB")
	assert.Equal(t, 1+20+1, strings.Count(err.Error(), "\n")+1)
	for _, p := range ps {
		require.NoError(t, a.Free(p))
	}
	require.NoError(t, gpumemtest.FindLeaks(a))
	assert.Error(t, gpumemtest.FindLeaks(nil))
}

// A block freed but waiting for another stream's work is not a leak.
func TestPendingFreeIsNotALeak(t *testing.T) {
	f := run(func(t gpumemtest.TB) {
		a := gpumemtest.New(t)
		dev := a.Device().(*sim.Device)
		side, err := dev.NewStream()
		if err != nil {
			t.Fatalf("%v", err)
		}
		_ = dev.SetStreamBusy(side, true)
		p := mustAlloc(t, a, 8*mib)
		if err := a.RecordStream(p, side); err != nil {
			t.Fatalf("%v", err)
		}
		_ = a.Free(p)
		if st := a.Stats(); st.ActiveBytes[stats.All].Current == 0 {
			t.Fatalf("the block should be pending")
		}
	})
	assert.False(t, f.failed(), "%v %v", f.errors, f.fatals)
}

func TestBudget(t *testing.T) {
	workload := func(t gpumemtest.TB, a *allocator.Allocator) {
		// 10 blocks of 3 MiB in 20 MiB segments: two segments, 40 MiB
		// reserved for 30 MiB requested.
		var ps []device.Ptr
		for range 10 {
			ps = append(ps, mustAlloc(t, a, 3*mib))
		}
		for _, p := range ps {
			_ = a.Free(p)
		}
	}
	f := run(func(t gpumemtest.TB) {
		a := gpumemtest.New(t, gpumemtest.WithBudget(gpumemtest.Budget{MaxReserved: 32 * mib, MaxFragmentation: 1.2}))
		workload(t, a)
	})
	require.Len(t, f.errors, 1)
	assert.Equal(t, "gpumemtest: device 0: peak reserved 40.00 MiB (41943040 bytes) is over the budget of 32.00 MiB (33554432 bytes); "+
		"fragmentation 1.333 is over the budget of 1.200 "+
		"(peak reserved 40.00 MiB, peak allocated 30.00 MiB, peak requested 30.00 MiB; fragmentation = peak reserved / peak requested = 1.333)", f.errors[0])

	f = run(func(t gpumemtest.TB) {
		a := gpumemtest.New(t, gpumemtest.WithBudget(gpumemtest.Budget{MaxReserved: 40 * mib, MaxFragmentation: 1.34}))
		workload(t, a)
	})
	assert.False(t, f.failed(), "%v", f.errors)

	f = run(func(t gpumemtest.TB) {
		a := gpumemtest.New(t)
		workload(t, a)
		gpumemtest.VerifyBudget(t, a, gpumemtest.Budget{MaxFragmentation: 1.3})
	})
	require.Len(t, f.errors, 1)
	assert.Contains(t, f.errors[0], "fragmentation 1.333 is over the budget of 1.300")
	assert.NotContains(t, f.errors[0], "peak reserved 40.00 MiB (", "only the bound exceeded is named")

	f = run(func(t gpumemtest.TB) {
		gpumemtest.VerifyBudget(t, nil, gpumemtest.Budget{})
	})
	assert.Len(t, f.errors, 1)

	var st stats.DeviceStats
	for _, b := range []gpumemtest.Budget{{MaxFragmentation: math.NaN()}, {MaxFragmentation: -1}} {
		assert.ErrorContains(t, b.Check(st), "invalid budget")
	}
	assert.NoError(t, gpumemtest.Budget{MaxReserved: 1, MaxFragmentation: 1}.Check(st))
}

func TestFragmentation(t *testing.T) {
	var st stats.DeviceStats
	assert.Equal(t, 1.0, gpumemtest.Fragmentation(st))
	st.ReservedBytes.Increase(stats.LargePool, 20*mib)
	assert.True(t, math.IsInf(gpumemtest.Fragmentation(st), 1))
	st.RequestedBytes.Increase(stats.LargePool, 16*mib)
	assert.Equal(t, 1.25, gpumemtest.Fragmentation(st))
}

func TestFixtureOptions(t *testing.T) {
	f := run(func(t gpumemtest.TB) {
		a := gpumemtest.New(t,
			gpumemtest.WithDevice(sim.Config{Ordinal: 2, PageSize: 1 * mib}),
			gpumemtest.WithCapacity(64*mib),
			gpumemtest.WithConfig(allocator.Config{ExpandableSegments: true}))
		dev := a.Device().(*sim.Device)
		if dev.Ordinal() != 2 || dev.Capacity() != 64*mib || dev.PageSize() != mib || !a.Config().ExpandableSegments {
			t.Errorf("options not applied: %v", dev)
		}
		if _, err := a.Alloc(80*mib, device.DefaultStream); err == nil {
			t.Errorf("80 MiB should not fit in 64 MiB")
		}
	})
	assert.False(t, f.failed(), "%v", f.errors)

	// AllowLeaks: the cleanup leaves allocated blocks alone.
	f = run(func(t gpumemtest.TB) {
		a := gpumemtest.New(t, gpumemtest.AllowLeaks())
		mustAlloc(t, a, mib)
	})
	assert.False(t, f.failed(), "%v", f.errors)

	// What cannot be built fails the test, without a panic.
	for _, opt := range []gpumemtest.Option{
		gpumemtest.WithDevice(sim.Config{PageSize: 3}),
		gpumemtest.WithConfig(allocator.Config{MemoryFraction: 2}),
	} {
		var a *allocator.Allocator
		f = run(func(t gpumemtest.TB) { a = gpumemtest.New(t, opt, nil) })
		assert.Len(t, f.fatals, 1)
		assert.Nil(t, a)
	}
}

// The helpers with a real *testing.T.
func TestWithTestingT(t *testing.T) {
	a := gpumemtest.New(t, gpumemtest.WithCapacity(1<<30), gpumemtest.WithBudget(gpumemtest.Budget{MaxReserved: 1 << 30}))
	defer gpumemtest.VerifyNoLeaks(t, a)
	p := mustAlloc(t, a, 10*mib)
	require.NoError(t, a.Free(p))
}

// NewOn builds on the device given, with New's cleanup, and refuses what
// it cannot use.
func TestNewOn(t *testing.T) {
	dev, err := sim.New(sim.Config{Ordinal: 5, Capacity: 64 * mib})
	require.NoError(t, err)
	var a *allocator.Allocator
	f := run(func(t gpumemtest.TB) {
		a = gpumemtest.NewOn(t, dev, gpumemtest.WithConfig(allocator.Config{ExpandableSegments: true}))
		if a.Device() != device.Device(dev) || !a.Config().ExpandableSegments {
			t.Errorf("NewOn did not build on the device given with the configuration given")
		}
		mustAlloc(t, a, mib)
	})
	require.Len(t, f.errors, 1, "the block left allocated fails the test")
	assert.Contains(t, f.errors[0], "gpumemtest: device 5: 1 block (1024.00 KiB) still allocated")
	assert.Empty(t, f.fatals)

	for name, test := range map[string]func(t gpumemtest.TB) *allocator.Allocator{
		"nil device": func(t gpumemtest.TB) *allocator.Allocator { return gpumemtest.NewOn(t, nil) },
		"WithCapacity": func(t gpumemtest.TB) *allocator.Allocator {
			return gpumemtest.NewOn(t, dev, gpumemtest.WithCapacity(mib))
		},
		"WithDevice": func(t gpumemtest.TB) *allocator.Allocator {
			return gpumemtest.NewOn(t, dev, gpumemtest.WithDevice(sim.Config{}))
		},
		"bad config": func(t gpumemtest.TB) *allocator.Allocator {
			return gpumemtest.NewOn(t, dev, gpumemtest.WithConfig(allocator.Config{MemoryFraction: 2}))
		},
	} {
		var got *allocator.Allocator
		f := run(func(t gpumemtest.TB) { got = test(t) })
		assert.Len(t, f.fatals, 1, name)
		assert.Empty(t, f.errors, name)
		assert.Nil(t, got, name)
	}
}
