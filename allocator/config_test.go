package allocator

import (
	"strings"
	"testing"

	"github.com/gpumem/gpumem/internal/simtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func TestParseConfKeys(t *testing.T) {
	exp, err := ParseConf("expandable_segments:True")
	require.NoError(t, err)
	assert.True(t, exp.ExpandableSegments)
	cfg, err := ParseConf("max_split_size_mb:128,roundup_power2_divisions:4,garbage_collection_threshold:0.6,expandable_segments:False,per_process_memory_fraction:0.5,memory_limit_bytes:1000,max_non_split_rounding_mb:40")
	require.NoError(t, err)
	assert.EqualValues(t, 128*mib, cfg.MaxSplitSize)
	assert.EqualValues(t, 40*mib, cfg.MaxNonSplitRounding)
	for _, d := range cfg.RoundupPower2Divisions {
		assert.EqualValues(t, 4, d)
	}
	assert.Equal(t, 0.6, cfg.GarbageCollectionThreshold)
	assert.False(t, cfg.ExpandableSegments)
	assert.Equal(t, 0.5, cfg.MemoryFraction)
	assert.EqualValues(t, 1000, cfg.MemoryLimit)

	zero, err := ParseConf("")
	require.NoError(t, err)
	assert.Equal(t, Config{}, zero)
	_, err = ParseConf("max_split_size_mb:64,")
	require.NoError(t, err, "a trailing comma is accepted, as PyTorch accepts it")
	spaced, err := ParseConf(" max_split_size_mb : 64 ")
	require.NoError(t, err, "spaces are ignored, as PyTorch does")
	assert.EqualValues(t, 64*mib, spaced.MaxSplitSize)
	full, err := ParseConf("per_process_memory_fraction:1")
	require.NoError(t, err)
	assert.EqualValues(t, 1, full.MemoryFraction, "the whole device is a cap, as in PyTorch")
}

func TestParseConfPyTorchKeysAccepted(t *testing.T) {
	_, err := ParseConf("backend:native,release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:False,pinned_num_register_threads:8,pinned_use_background_threads:True")
	require.NoError(t, err)
}

// TestRoundupIntervals checks the list form of roundup_power2_divisions
// against PyTorch 2.6's parser: the first pair fills the intervals below
// it, and ">" fills from the previous pair's interval (inclusive) on.
func TestRoundupIntervals(t *testing.T) {
	cfg, err := ParseConf("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]")
	require.NoError(t, err)
	var want [NumRoundupIntervals]uint64
	for i := range want {
		switch {
		case i <= 8:
			want[i] = 1 // below and at 256 MiB (index log2(256) = 8)
		case i == 9:
			want[i] = 2 // [512 MiB, 1 GiB)
		default:
			want[i] = 8 // ">" starts at the 1024 entry, overriding its 4
		}
	}
	assert.Equal(t, want, cfg.RoundupPower2Divisions)

	cfg, err = ParseConf("roundup_power2_divisions:[>:2]")
	require.NoError(t, err)
	for _, d := range cfg.RoundupPower2Divisions {
		assert.EqualValues(t, 2, d)
	}
	cfg, err = ParseConf("roundup_power2_divisions:[1:4,65536:16]")
	require.NoError(t, err)
	assert.EqualValues(t, 4, cfg.RoundupPower2Divisions[0])
	assert.EqualValues(t, 16, cfg.RoundupPower2Divisions[15], "intervals past 32 GiB clamp to the last entry")
	assert.EqualValues(t, 0, cfg.RoundupPower2Divisions[7])

	a, _ := newTest(t, 0, cfg)
	mustAlloc(t, a, 1200*kib, 0)
	assert.EqualValues(t, 1280*kib, get(t, a, "allocated_bytes.all.current"), "1200 KiB rounds to the next quarter of [1, 2) MiB")
}

// TestConfigStringRoundTrip: String renders a Config that ParseConf reads
// back unchanged.
func TestConfigStringRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var c Config
		if rapid.Bool().Draw(t, "split") {
			c.MaxSplitSize = rapid.Uint64Range(21, 1<<20).Draw(t, "mb") * mib
		}
		if rapid.Bool().Draw(t, "rounding") {
			c.MaxNonSplitRounding = rapid.Uint64Range(21, 1<<20).Draw(t, "rmb") * mib
		}
		if rapid.Bool().Draw(t, "roundup") {
			for i := range c.RoundupPower2Divisions {
				c.RoundupPower2Divisions[i] = rapid.SampledFrom([]uint64{0, 1, 2, 4, 8, 16}).Draw(t, "d")
			}
		}
		if rapid.Bool().Draw(t, "gc") {
			c.GarbageCollectionThreshold = rapid.Float64Range(0.01, 0.99).Draw(t, "g")
		}
		if rapid.Bool().Draw(t, "fraction") {
			c.MemoryFraction = rapid.Float64Range(0.01, 0.99).Draw(t, "f")
		}
		c.MemoryLimit = rapid.Uint64().Draw(t, "limit")
		if rapid.Bool().Draw(t, "large") {
			c.LargeSegmentSize = rapid.Uint64Range(11, 1<<20).Draw(t, "lmb") * mib
			c.MaxSplitSize = max(c.MaxSplitSize, c.LargeSegmentSize)
			if c.MaxNonSplitRounding != 0 {
				c.MaxNonSplitRounding = max(c.MaxNonSplitRounding, c.LargeSegmentSize)
			}
		}
		if rapid.Bool().Draw(t, "reserve") {
			c.ExpandableSegmentsReserve = Reserve{Value: rapid.Float64Range(1e-9, 1e9).Draw(t, "rv"), GiB: rapid.Bool().Draw(t, "gib")}
		}
		if rapid.Bool().Draw(t, "classes") {
			classes := map[string]Reserve{}
			for _, n := range rapid.SliceOfN(rapid.StringMatching(`[a-z_0-9]{1,8}`), 1, 4).Draw(t, "names") {
				classes[n] = Reserve{Value: rapid.Float64Range(1e-3, 64).Draw(t, "cv"), GiB: rapid.Bool().Draw(t, "cg")}
			}
			c.ExpandableSegmentsReserveByClass = formatClasses(classes)
		}
		c.ExpandableSegments = rapid.Bool().Draw(t, "exp")
		c.EarlyOOM = rapid.Bool().Draw(t, "early")
		c.ReleaseLockOnMalloc = rapid.Bool().Draw(t, "lock")
		c.GraphCaptureRecordStreamReuse = rapid.Bool().Draw(t, "graph")
		c.Backend = rapid.SampledFrom([]Backend{BackendNative, BackendCudaMallocAsync}).Draw(t, "backend")
		c.Pinned = PinnedConfig{
			UseHostRegister:      rapid.Bool().Draw(t, "reg"),
			NumRegisterThreads:   rapid.SampledFrom([]uint64{0, 1, 2, 8, 128}).Draw(t, "threads"),
			ReserveSegmentSize:   rapid.Uint64Range(0, 1<<20).Draw(t, "pinmb") * mib,
			UseBackgroundThreads: rapid.Bool().Draw(t, "bg"),
			FreeCatchAll:         rapid.Bool().Draw(t, "catch"),
		}
		got, err := ParseConf(c.String())
		if err != nil {
			t.Fatalf("ParseConf(%q): %v", c.String(), err)
		}
		if got != c {
			t.Fatalf("ParseConf(%q) = %+v, want %+v", c.String(), got, c)
		}
	})
}

// FuzzParseConf: ParseConf never panics, and a configuration it accepts
// renders (String) to text that parses back to the same Config.
func FuzzParseConf(f *testing.F) {
	for _, s := range []string{
		"", "max_split_size_mb:128", "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
		"garbage_collection_threshold:0.6,per_process_memory_fraction:0.5", "expandable_segments:True",
		"backend:native,pinned_num_register_threads:8", "max_split_size_mb:64:65", "roundup_power2_divisions:[",
		"backend:cudaMallocAsync,per_process_memory_fraction:0.5",
		"large_segment_size_mb:12,max_split_size_mb:12,max_non_split_rounding_mb:40",
		"expandable_segments:True,expandable_segments_reserve:0.5,throw_on_cudamalloc_oom:True",
		"expandable_segments_reserve:40G,expandable_segments_reserve_by_class:[prefill:40G,decode:0.25,]",
		"per_process_memory_fraction:0.95,throw_on_cudamalloc_oom:True,graph_capture_record_stream_reuse:True",
		"pinned_use_cuda_host_register:True,pinned_num_register_threads:8,pinned_reserve_segment_size_mb:64,pinned_free_catch_all:True",
		"release_lock_on_hipmalloc:False,pinned_use_hip_host_register:True,pinned_use_background_threads:True",
		"expandable_segments_reserve_by_class:[a:1e-3,a:2g]", "expandable_segments_reserve:1e308G",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseConf(s)
		if err != nil {
			return
		}
		again, err := ParseConf(c.String())
		if err != nil {
			t.Fatalf("ParseConf(%q) accepted, but its String %q does not parse: %v", s, c.String(), err)
		}
		if again != c {
			t.Fatalf("ParseConf(%q) = %+v; String %q parses to %+v", s, c, c.String(), again)
		}
	})
}

// TestConfigOverflowsRefused: values whose byte size or use would wrap
// 64 bits are refused, naming the key, instead of silently changing
// decisions (a rounding limit that wraps disables reuse; divisions that
// wrap round 100 MiB up to 128 MiB).
func TestConfigOverflowsRefused(t *testing.T) {
	for _, conf := range []string{
		"max_split_size_mb:64,max_non_split_rounding_mb:17592186044415",
		"max_split_size_mb:17592186044415",
		"max_non_split_rounding_mb:1099511627777",
		"roundup_power2_divisions:9223372036854775808",
		"roundup_power2_divisions:[256:9223372036854775808]",
		"roundup_power2_divisions:[>:2097152]",
	} {
		_, err := ParseConf(conf)
		require.Error(t, err, conf)
		key := conf[:strings.IndexByte(conf, ':')]
		if strings.Contains(conf, "max_non_split") {
			key = "max_non_split_rounding_mb"
		}
		assert.Contains(t, err.Error(), key, conf)
	}
	// The largest accepted values work without wrapping.
	cfg, err := ParseConf("max_split_size_mb:1099511627776,max_non_split_rounding_mb:1099511627776,roundup_power2_divisions:1048576")
	require.NoError(t, err)
	a, dev := newOn(t, cfg)
	p := mustAlloc(t, a, 100*mib, 0)
	assert.EqualValues(t, 100*mib, get(t, a, "allocated_bytes.all.current"), "100 MiB rounds to itself, not to 128 MiB")
	mustFree(t, a, p)
	q := mustAlloc(t, a, 100*mib, 0)
	assert.Equal(t, p, q, "the cached block is reused")
	assert.EqualValues(t, 1, get(t, a, "num_device_alloc"))

	for _, c := range []Config{
		{MaxSplitSize: 1 << 61},
		{MaxNonSplitRounding: 1 << 61},
		{RoundupPower2Divisions: [NumRoundupIntervals]uint64{1 << 63}},
	} {
		_, err := New(dev, c)
		assert.Error(t, err, "%+v", c)
	}
}

// TestFractionOneTurnsGarbageCollectionOn: a memory fraction of 1 caps at
// the device's memory, as PyTorch's set_per_process_memory_fraction(1.0)
// does, so the garbage-collection threshold acts: cached blocks are
// collected before the device is asked, instead of a full flush and
// retry.
func TestFractionOneTurnsGarbageCollectionOn(t *testing.T) {
	retries := func(conf string) int64 {
		cfg, err := ParseConf(conf)
		require.NoError(t, err)
		a, _ := newOn(t, cfg, simtest.Capacity(100*mib))
		mustFree(t, a, mustAlloc(t, a, 40*mib, 0))
		mustFree(t, a, mustAlloc(t, a, 45*mib, 0))
		mustAlloc(t, a, 50*mib, 0)
		return get(t, a, "num_alloc_retries")
	}
	assert.EqualValues(t, 1, retries("garbage_collection_threshold:0.5"), "no cap: the threshold is inactive")
	assert.EqualValues(t, 0, retries("garbage_collection_threshold:0.5,per_process_memory_fraction:1"))
}
