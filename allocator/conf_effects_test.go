package allocator

import (
	"errors"
	"testing"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/simtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func mustParse(t *testing.T, conf string) Config {
	t.Helper()
	c, err := ParseConf(conf)
	require.NoError(t, err, conf)
	return c
}

// TestLargeSegmentSize: large_segment_size_mb sizes the segments of 1-10
// MiB requests; unset, they stay PyTorch 2.6's 20 MiB.
func TestLargeSegmentSize(t *testing.T) {
	for _, c := range []struct {
		conf       string
		req, seg   uint64
		deviceAsks int64
	}{
		{"", 3 * mib, 20 * mib, 1},
		{"large_segment_size_mb:12", 3 * mib, 12 * mib, 1},
		{"large_segment_size_mb:64", 3 * mib, 64 * mib, 1},
		{"large_segment_size_mb:12", 11 * mib, 12 * mib, 1}, // 10 MiB and more: rounded to 2 MiB as before
		{"large_segment_size_mb:12", mib, 2 * mib, 1},       // the small pool keeps 2 MiB
	} {
		a, dev := newTest(t, 0, mustParse(t, c.conf))
		mustAlloc(t, a, c.req, 0)
		assert.EqualValues(t, c.seg, get(t, a, "reserved_bytes.all.current"), "%s: %d bytes", c.conf, c.req)
		assert.Equal(t, c.deviceAsks, dev.Counters().Mallocs, c.conf)
	}

	// Four 3 MiB requests share one 12 MiB segment; the fifth needs another.
	a, dev := newTest(t, 0, mustParse(t, "large_segment_size_mb:12"))
	for range 4 {
		mustAlloc(t, a, 3*mib, 0)
	}
	assert.EqualValues(t, 1, dev.Counters().Mallocs)
	mustAlloc(t, a, 3*mib, 0)
	assert.EqualValues(t, 2, dev.Counters().Mallocs)
	assert.EqualValues(t, 24*mib, get(t, a, "reserved_bytes.all.current"))
}

// TestLargeSegmentSetsRoundingDefault: max_non_split_rounding_mb defaults
// to the large segment size, so with large_segment_size_mb:64 a cached
// oversize block 40 MiB larger than an oversize request serves it (with
// 2.6's 20 MiB, or 32 MiB, it does not).
func TestLargeSegmentSetsRoundingDefault(t *testing.T) {
	reuse := func(conf string) bool {
		a, _ := newTest(t, 0, mustParse(t, conf))
		p := mustAlloc(t, a, 200*mib, 0)
		mustFree(t, a, p)
		return mustAlloc(t, a, 160*mib, 0) == p
	}
	assert.False(t, reuse("max_split_size_mb:128"), "a 200 MiB block is more than 20 MiB too large for 160 MiB")
	assert.True(t, reuse("max_split_size_mb:128,large_segment_size_mb:64"))
	assert.False(t, reuse("max_split_size_mb:128,large_segment_size_mb:32"), "40 MiB too large is more than 32")
}

// TestLargeSegmentPagesExpandable: with expandable segments the large
// pool maps pages of the large segment size, which must be a multiple of
// the device's mapping granularity.
func TestLargeSegmentPagesExpandable(t *testing.T) {
	a, _ := newTest(t, 0, mustParse(t, "expandable_segments:True,large_segment_size_mb:40"))
	mustAlloc(t, a, 3*mib, 0)
	assert.EqualValues(t, 40*mib, get(t, a, "reserved_bytes.all.current"))

	_, err := New(simtest.New(t), mustParse(t, "expandable_segments:True,large_segment_size_mb:11"))
	require.Error(t, err)
	assert.ErrorIs(t, err, device.ErrNotSupported)
	assert.Contains(t, err.Error(), "not a multiple of the device's mapping granularity")
	_, err = New(simtest.New(t), mustParse(t, "large_segment_size_mb:11"))
	assert.NoError(t, err, "without expandable segments any size over 10 MiB does")
}

// reserveRecorder is a simulated device that records the sizes of the
// address ranges reserved from it.
type reserveRecorder struct {
	*sim.Device
	sizes []uint64
}

func (r *reserveRecorder) Reserve(size uint64) (device.Ptr, error) {
	r.sizes = append(r.sizes, size)
	return r.Device.Reserve(size)
}

// TestExpandableSegmentsReserve: expandable_segments_reserve sizes the
// address range of each expandable segment, capped at PyTorch's 9/8 of the
// device and rounded up to pages; a request larger than the range is out
// of memory without mapping anything.
func TestExpandableSegmentsReserve(t *testing.T) {
	const total = 1 << 30
	ranges := func(conf string, reqs ...uint64) ([]uint64, *reserveRecorder, []error) {
		dev := &reserveRecorder{Device: simtest.New(t, simtest.Capacity(total))}
		a := onDevice(t, dev, mustParse(t, conf))
		var errs []error
		for _, r := range reqs {
			_, err := a.Alloc(r, 0)
			errs = append(errs, err)
		}
		require.NoError(t, a.CheckInvariants())
		return dev.sizes, dev, errs
	}
	full := uint64(total + total/8)
	sizes, _, _ := ranges("expandable_segments:True", 3*mib, 512)
	assert.Equal(t, []uint64{(full + 20*mib - 1) / (20 * mib) * 20 * mib, full}, sizes, "unset: 9/8 of the device, in pages (large, then small)")
	sizes, _, _ = ranges("expandable_segments:True,expandable_segments_reserve:0.25", 3*mib, 512)
	assert.Equal(t, []uint64{260 * mib, 256 * mib}, sizes, "a quarter of 1 GiB, in 20 MiB and 2 MiB pages")
	sizes, _, _ = ranges("expandable_segments:True,expandable_segments_reserve:0.5G", 3*mib)
	assert.Equal(t, []uint64{520 * mib}, sizes, "0.5 GiB, in 20 MiB pages")
	sizes, _, _ = ranges("expandable_segments:True,expandable_segments_reserve:4", 3*mib)
	assert.Equal(t, []uint64{(full + 20*mib - 1) / (20 * mib) * 20 * mib}, sizes, "capped at 9/8 of the device")
	sizes, _, _ = ranges("expandable_segments_reserve:0.25", 3*mib)
	assert.Empty(t, sizes, "without expandable segments nothing is reserved")

	sizes, dev, errs := ranges("expandable_segments:True,expandable_segments_reserve:0.05", 100*mib)
	var oom *OutOfMemoryError
	require.ErrorAs(t, errs[0], &oom, "100 MiB cannot fit a 60 MiB range")
	assert.Empty(t, sizes, "nothing is reserved for a request that cannot fit")
	assert.Zero(t, dev.Counters().Maps)
}

// TestEarlyOOM: throw_on_cudamalloc_oom refuses a cache miss that would
// pass the cap before asking the device and without flushing the cache;
// without it the ladder flushes and retries.
func TestEarlyOOM(t *testing.T) {
	run := func(conf string) (*Allocator, *sim.Device, error) {
		a, dev := newTest(t, 100*mib, mustParse(t, conf))
		mustFree(t, a, mustAlloc(t, a, 44*mib, 0)) // 44 MiB cached
		_, err := a.Alloc(46*mib, 0)               // 44 + 46 > 50: over the cap
		return a, dev, err
	}
	a, _, err := run("per_process_memory_fraction:0.5")
	require.NoError(t, err, "2.6's ladder: the cached 44 MiB are released and the retry fits")
	assert.EqualValues(t, 1, get(t, a, "num_alloc_retries"))

	a, dev, err := run("per_process_memory_fraction:0.5,throw_on_cudamalloc_oom:True")
	var oom *OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	assert.ErrorIs(t, err, device.ErrOutOfMemory)
	assert.EqualValues(t, 46*mib, oom.AllocSize)
	assert.EqualValues(t, 50*mib, oom.Allowed)
	assert.EqualValues(t, 44*mib, get(t, a, "reserved_bytes.all.current"), "the cache is kept")
	assert.EqualValues(t, 0, get(t, a, "num_alloc_retries"))
	assert.EqualValues(t, 1, get(t, a, "num_ooms"))
	assert.EqualValues(t, 1, dev.Counters().Mallocs, "only the first segment was asked for")
	assert.Zero(t, dev.Counters().FailedMallocs)

	// The cap may come from SetMemoryFraction too; a request within it
	// goes on as before.
	a, dev = newTest(t, 100*mib, mustParse(t, "throw_on_cudamalloc_oom:True"))
	require.NoError(t, a.SetMemoryFraction(0.5))
	mustAlloc(t, a, 40*mib, 0)
	_, err = a.Alloc(20*mib, 0)
	require.ErrorAs(t, err, &oom)
	assert.EqualValues(t, 1, dev.Counters().Mallocs)

	// With no cap, the device's total memory is the limit.
	for _, c := range []struct {
		conf   string
		failed int64
	}{{"", 2}, {"throw_on_cudamalloc_oom:True", 0}} { // 2.6: asked, flushed, asked again
		a, dev := newTest(t, 100*mib, mustParse(t, c.conf))
		_, err := a.Alloc(120*mib, 0)
		require.ErrorAs(t, err, &oom, c.conf)
		assert.Equal(t, c.failed, dev.Counters().FailedMallocs, "%q: device asked", c.conf)
	}
}

// TestMemoryFractionFromConf: per_process_memory_fraction caps exactly as
// SetMemoryFraction does.
func TestMemoryFractionFromConf(t *testing.T) {
	outcome := func(a *Allocator) (uint64, bool) {
		mustAlloc(t, a, 30*mib, 0)
		_, err := a.Alloc(30*mib, 0)
		var oom *OutOfMemoryError
		if errors.As(err, &oom) {
			return oom.Allowed, true
		}
		require.NoError(t, err)
		return 0, false
	}
	fromConf, _ := newTest(t, 100*mib, mustParse(t, "per_process_memory_fraction:0.5"))
	bySetter, _ := newTest(t, 100*mib, Config{})
	require.NoError(t, bySetter.SetMemoryFraction(0.5))
	a1, oom1 := outcome(fromConf)
	a2, oom2 := outcome(bySetter)
	assert.True(t, oom1)
	assert.Equal(t, a2, a1)
	assert.Equal(t, oom2, oom1)
	assert.EqualValues(t, 50*mib, a1)
}

// TestInertKeysChangeNothing: the keys that have no effect here (see their
// Config fields) leave every decision as the default's.
func TestInertKeysChangeNothing(t *testing.T) {
	run := func(conf string) []int64 {
		a, dev := newTest(t, 200*mib, mustParse(t, conf))
		var ps []device.Ptr
		for i, n := range []uint64{3 * mib, 512, 30 * mib, 7 * mib, mib + 1, 90 * mib} {
			p, err := a.Alloc(n, 0)
			if err == nil {
				ps = append(ps, p)
			}
			if i%2 == 1 && len(ps) > 0 {
				mustFree(t, a, ps[0])
				ps = ps[1:]
			}
		}
		return []int64{get(t, a, "reserved_bytes.all.peak"), get(t, a, "num_alloc_retries"), dev.Counters().Mallocs, int64(ps[0])}
	}
	want := run("")
	for _, conf := range []string{
		"release_lock_on_cudamalloc:True",
		"graph_capture_record_stream_reuse:True",
		"expandable_segments_reserve_by_class:[a:0.5]",
		"expandable_segments_reserve:0.5",
		"pinned_use_cuda_host_register:True,pinned_num_register_threads:8,pinned_reserve_segment_size_mb:64,pinned_use_background_threads:True,pinned_free_catch_all:True",
		"backend:native",
	} {
		assert.Equal(t, want, run(conf), conf)
	}
}
