package allocator

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/internal/quote"
)

// TestParseConfGoodValues: every key current PyTorch accepts, with the
// values its rules allow, sets what it names.
func TestParseConfGoodValues(t *testing.T) {
	for _, c := range []struct {
		conf string
		want Config
	}{
		{"large_segment_size_mb:12", Config{LargeSegmentSize: 12 * mib}},
		{"large_segment_size_mb:11", Config{LargeSegmentSize: 11 * mib}},
		{"large_segment_size_mb:1099511627776", Config{LargeSegmentSize: 1 << 60}},
		{"max_split_size_mb:20", Config{MaxSplitSize: 20 * mib}},
		{"max_split_size_mb:12,large_segment_size_mb:12", Config{MaxSplitSize: 12 * mib, LargeSegmentSize: 12 * mib}},
		{"max_non_split_rounding_mb:20", Config{MaxNonSplitRounding: 20 * mib}},
		{"max_non_split_rounding_mb:64,large_segment_size_mb:64", Config{MaxNonSplitRounding: 64 * mib, LargeSegmentSize: 64 * mib}},
		{"garbage_collection_threshold:0.6", Config{GarbageCollectionThreshold: 0.6}},
		{"garbage_collection_threshold:1e-3", Config{GarbageCollectionThreshold: 0.001}},
		{"roundup_power2_divisions:4", Config{RoundupPower2Divisions: fill(4)}},
		{"roundup_power2_divisions:[]", Config{}},
		{"expandable_segments:True", Config{ExpandableSegments: true}},
		{"expandable_segments:False", Config{}},
		{"expandable_segments_reserve:0.5", Config{ExpandableSegmentsReserve: Reserve{Value: 0.5}}},
		{"expandable_segments_reserve:2", Config{ExpandableSegmentsReserve: Reserve{Value: 2}}},
		{"expandable_segments_reserve:40G", Config{ExpandableSegmentsReserve: Reserve{Value: 40, GiB: true}}},
		{"expandable_segments_reserve:1.5g", Config{ExpandableSegmentsReserve: Reserve{Value: 1.5, GiB: true}}},
		{"expandable_segments_reserve_by_class:[prefill:40G,decode:0.25]", Config{ExpandableSegmentsReserveByClass: "decode:0.25,prefill:40G"}},
		{"expandable_segments_reserve_by_class:[b:0.5,a:0.25,]", Config{ExpandableSegmentsReserveByClass: "a:0.25,b:0.5"}},
		{"expandable_segments_reserve_by_class:[a:0.5,a:0.75]", Config{ExpandableSegmentsReserveByClass: "a:0.75"}},
		{"expandable_segments_reserve_by_class:[]", Config{}},
		{"per_process_memory_fraction:0.5", Config{MemoryFraction: 0.5}},
		{"per_process_memory_fraction:1", Config{MemoryFraction: 1}},
		{"per_process_memory_fraction:0", Config{}},
		{"throw_on_cudamalloc_oom:True", Config{EarlyOOM: true}},
		{"throw_on_cudamalloc_oom:False", Config{}},
		{"release_lock_on_cudamalloc:True", Config{ReleaseLockOnMalloc: true}},
		{"release_lock_on_hipmalloc:True", Config{ReleaseLockOnMalloc: true}},
		{"graph_capture_record_stream_reuse:True", Config{GraphCaptureRecordStreamReuse: true}},
		{"backend:native", Config{}},
		{"backend:cudaMallocAsync", Config{Backend: BackendCudaMallocAsync}},
		{"backend:hipMallocAsync", Config{Backend: BackendCudaMallocAsync}},
		{"backend:cudaMallocAsync,backend:native", Config{}},
		{"pinned_use_cuda_host_register:True", Config{Pinned: PinnedConfig{UseHostRegister: true}}},
		{"pinned_use_hip_host_register:True", Config{Pinned: PinnedConfig{UseHostRegister: true}}},
		{"pinned_num_register_threads:1", Config{Pinned: PinnedConfig{NumRegisterThreads: 1}}},
		{"pinned_num_register_threads:128", Config{Pinned: PinnedConfig{NumRegisterThreads: 128}}},
		{"pinned_reserve_segment_size_mb:1", Config{Pinned: PinnedConfig{ReserveSegmentSize: mib}}},
		{"pinned_use_background_threads:True", Config{Pinned: PinnedConfig{UseBackgroundThreads: true}}},
		{"pinned_free_catch_all:True", Config{Pinned: PinnedConfig{FreeCatchAll: true}}},
		{"memory_limit_bytes:1000", Config{MemoryLimit: 1000}},
		{"expandable_segments:True,expandable_segments:False", Config{}},
		{" large_segment_size_mb :\t12 ,\n", Config{LargeSegmentSize: 12 * mib}},
	} {
		got, err := ParseConf(c.conf)
		if assert.NoError(t, err, c.conf) {
			assert.Equal(t, c.want, got, c.conf)
		}
	}
}

func fill(d uint64) (t [NumRoundupIntervals]uint64) {
	for i := range t {
		t[i] = d
	}
	return t
}

// TestParseConfBadValues: each value current PyTorch refuses is refused,
// with an error that says what is wrong; gpumem's stricter rules (decimal
// digits only, a bad reserve is an error) are here too.
func TestParseConfBadValues(t *testing.T) {
	for conf, want := range map[string]string{
		// the syntax
		"bogus:1":                            `unrecognized key "bogus"`,
		"max_split_size_mb":                  `expected ":", found the end after key "max_split_size_mb"`,
		"max_split_size_mb:":                 `missing value for "max_split_size_mb"`,
		"max_split_size_mb:64 max_non_split": `bad value "64max_non_split"`,
		"max_split_size_mb:64,,":             `expected a key, found ","`,
		"max_split_size_mb:64:65":            `expected ",", found ":"`,
		// large_segment_size_mb: an integer above 10 (MiB)
		"large_segment_size_mb:10":                   "large_segment_size_mb:10 is too small: it must be more than 10",
		"large_segment_size_mb:0":                    "large_segment_size_mb:0 is too small",
		"large_segment_size_mb:-1":                   `bad value "-1" for "large_segment_size_mb": want a non-negative integer`,
		"large_segment_size_mb:12.5":                 `bad value "12.5"`,
		"large_segment_size_mb:1099511627777":        "large_segment_size_mb:1099511627777 is too large",
		"large_segment_size_mb:99999999999999999999": "want an integer below 2^64",
		// max_split_size_mb and max_non_split_rounding_mb: at least the large segment size
		"max_split_size_mb:19":                                  "max_split_size_mb:19 is too small: it must be at least 20",
		"max_split_size_mb:0":                                   "max_split_size_mb:0 is too small",
		"max_split_size_mb:20,large_segment_size_mb:40":         "max_split_size_mb:20 is too small: it must be at least 40",
		"large_segment_size_mb:40,max_split_size_mb:39":         "max_split_size_mb:39 is too small: it must be at least 40",
		"max_split_size_mb:abc":                                 `bad value "abc" for "max_split_size_mb"`,
		"max_split_size_mb:+64":                                 `bad value "+64"`,
		"max_non_split_rounding_mb:19":                          "max_non_split_rounding_mb:19 is too small",
		"max_non_split_rounding_mb:30,large_segment_size_mb:32": "max_non_split_rounding_mb:30 is too small: it must be at least 32",
		"max_non_split_rounding_mb:99999999999999":              "too large",
		// garbage_collection_threshold: (0, 1)
		"garbage_collection_threshold:1.0":    "garbage_collection_threshold:1 must be in (0, 1)",
		"garbage_collection_threshold:0":      "must be in (0, 1)",
		"garbage_collection_threshold:-0.5":   "must be in (0, 1)",
		"garbage_collection_threshold:nan":    "want a decimal number",
		"garbage_collection_threshold:0x1p-1": "want a decimal number",
		"garbage_collection_threshold:0.5x":   "want a decimal number",
		// roundup_power2_divisions
		"roundup_power2_divisions:3":             "roundup_power2_divisions:3 must be a power of two",
		"roundup_power2_divisions:0":             "roundup_power2_divisions:0 must be a power of two",
		"roundup_power2_divisions:[256:3]":       "divisions 3 must be a power of two",
		"roundup_power2_divisions:[300:2]":       `interval "300" must be a power of two`,
		"roundup_power2_divisions:[0:2]":         `interval "0" must be a power of two`,
		"roundup_power2_divisions:[256:2":        "expected ',' or ']', found the end",
		"roundup_power2_divisions:[256:2;512:4]": "bad value",
		"roundup_power2_divisions:[256]":         `expected ":", found "]" in roundup_power2_divisions`,
		// booleans: exactly True or False
		"expandable_segments:true":            `bad value "true" for "expandable_segments": want True or False`,
		"expandable_segments:1":               "want True or False",
		"throw_on_cudamalloc_oom:true":        `bad value "true" for "throw_on_cudamalloc_oom": want True or False`,
		"release_lock_on_cudamalloc:yes":      "want True or False",
		"graph_capture_record_stream_reuse:1": "want True or False",
		"pinned_use_cuda_host_register:TRUE":  "want True or False",
		"pinned_use_background_threads:0":     "want True or False",
		"pinned_free_catch_all:false":         "want True or False",
		"expandable_segments:[True]":          `missing value for "expandable_segments"`,
		// expandable_segments_reserve: a positive, finite fraction or GiB
		"expandable_segments_reserve:0":      `bad value "0" for "expandable_segments_reserve": want a fraction`,
		"expandable_segments_reserve:-1":     "want a fraction of the device's memory (0.5) or GiB (40G), more than 0",
		"expandable_segments_reserve:G":      "want a fraction",
		"expandable_segments_reserve:inf":    "want a fraction",
		"expandable_segments_reserve:40GB":   "want a fraction",
		"expandable_segments_reserve:1e999G": "want a fraction",
		// expandable_segments_reserve_by_class: [NAME:RESERVE,...]
		"expandable_segments_reserve_by_class:a:0.5":  `want a list [NAME:RESERVE,...], found "a"`,
		"expandable_segments_reserve_by_class:[a:0]":  `bad value "0" for "expandable_segments_reserve_by_class"`,
		"expandable_segments_reserve_by_class:[a]":    `expected ":", found "]" in expandable_segments_reserve_by_class`,
		"expandable_segments_reserve_by_class:[a:0.5": "expected a class name or ']', found \"\"",
		"expandable_segments_reserve_by_class:[:0.5]": `expected a class name or ']', found ":"`,
		// per_process_memory_fraction: [0, 1]
		"per_process_memory_fraction:1.5":  "per_process_memory_fraction:1.5 must be in [0, 1]",
		"per_process_memory_fraction:-0.1": "must be in [0, 1]",
		"per_process_memory_fraction:half": "want a decimal number",
		// backend
		"backend:Native":          `backend:"Native" is not a backend: want native or cudaMallocAsync`,
		"backend:cudamallocasync": `backend:"cudamallocasync" is not a backend`,
		// pinned
		"pinned_num_register_threads:3":                "pinned_num_register_threads:3 must be a power of two up to 128",
		"pinned_num_register_threads:0":                "must be a power of two up to 128",
		"pinned_num_register_threads:256":              "must be a power of two up to 128",
		"pinned_reserve_segment_size_mb:0":             "pinned_reserve_segment_size_mb:0 must be more than 0",
		"pinned_reserve_segment_size_mb:1099511627777": "too large",
		// gpumem's own
		"gpumem_policy:lowfrag": `gpumem_policy:"lowfrag" is not a policy`,
	} {
		c, err := ParseConf(conf)
		if assert.Error(t, err, conf) {
			assert.Contains(t, err.Error(), want, conf)
			assert.Equal(t, Config{}, c, "%s: a refused configuration returns nothing", conf)
		}
	}
}

// TestParseConfQuotesAtMost100Bytes: an error quotes a bounded part of the
// text, however long the bad token.
func TestParseConfQuotesAtMost100Bytes(t *testing.T) {
	long := strings.Repeat("x", 1<<20)
	for _, conf := range []string{
		long + ":1",
		"max_split_size_mb:" + long,
		"expandable_segments:" + long,
		"expandable_segments_reserve:" + long,
		"gpumem_policy:" + long,
		"backend:" + long,
		"roundup_power2_divisions:[" + long + ":2]",
		"expandable_segments_reserve_by_class:[a:" + long + "]",
		"unknown_" + strings.Repeat("é", 1000) + ":1",
	} {
		_, err := ParseConf(conf)
		require.Error(t, err)
		assert.Less(t, len(err.Error()), 400, "%.40s...: %.200s", conf, err.Error())
		assert.Contains(t, err.Error(), `..."`, "the quote says it was cut")
	}
	_, err := ParseConf("expandable_segments:\x1b[31m" + strings.Repeat("\n", 1000))
	require.Error(t, err)
	assert.NotContains(t, err.Error(), "\x1b", "control characters are escaped")
	_, err = ParseConf("max_split_size_mb:64:" + long)
	require.Error(t, err)
	assert.Less(t, len(err.Error()), 400, "a token that is not quoted is not copied either")
	assert.Equal(t, `"abc"`, quote.Quote("abc"))
	cut := quote.Quote(strings.Repeat("é", 100))
	assert.Equal(t, `"`+strings.Repeat("é", 50)+`..." (200 bytes)`, cut, "cut at a character boundary")
}

// TestParseConfOrderOfLargeSegment: large_segment_size_mb bounds
// max_split_size_mb wherever it stands, as PyTorch reads it first.
func TestParseConfOrderOfLargeSegment(t *testing.T) {
	for _, conf := range []string{
		"large_segment_size_mb:32,max_split_size_mb:32",
		"max_split_size_mb:32,large_segment_size_mb:32",
	} {
		c, err := ParseConf(conf)
		require.NoError(t, err, conf)
		assert.EqualValues(t, 32*mib, c.MaxSplitSize)
		assert.EqualValues(t, 32*mib, c.maxNonSplitRounding(), "the rounding limit defaults to the large segment size")
	}
	c, err := ParseConf("")
	require.NoError(t, err)
	assert.EqualValues(t, 20*mib, c.largeSegment())
	assert.EqualValues(t, 20*mib, c.maxNonSplitRounding(), "PyTorch 2.6's 20 MiB unless set")
}

// TestRoundupListsAccumulate: a second roundup_power2_divisions list edits
// the table the first left, as PyTorch's parser does; a single value
// replaces it.
func TestRoundupListsAccumulate(t *testing.T) {
	c, err := ParseConf("roundup_power2_divisions:[1:4,>:4],roundup_power2_divisions:[256:8]")
	require.NoError(t, err)
	for i, d := range c.RoundupPower2Divisions {
		want := uint64(4)
		if i <= 8 {
			want = 8 // the second list's first pair fills below it
		}
		assert.Equal(t, want, d, "interval %d", i)
	}
	c, err = ParseConf("roundup_power2_divisions:[256:8],roundup_power2_divisions:2")
	require.NoError(t, err)
	assert.Equal(t, fill(2), c.RoundupPower2Divisions)
}

// TestConfEnvOrder: GPUMEM_ALLOC_CONF wins, then PYTORCH_ALLOC_CONF, then
// PYTORCH_CUDA_ALLOC_CONF; blank variables are passed over; an error names
// the variable.
func TestConfEnvOrder(t *testing.T) {
	assert.Equal(t, []string{"GPUMEM_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"}, ConfEnvVars())
	ConfEnvVars()[0] = "changed"
	assert.Equal(t, EnvVar, ConfEnvVars()[0], "the order cannot be changed through the slice")
	set := func(g, p, pc string) {
		t.Setenv("GPUMEM_ALLOC_CONF", g)
		t.Setenv("PYTORCH_ALLOC_CONF", p)
		t.Setenv("PYTORCH_CUDA_ALLOC_CONF", pc)
	}
	for _, c := range []struct {
		g, p, pc    string
		conf, from  string
		maxSplitMiB uint64
	}{
		{"max_split_size_mb:100", "max_split_size_mb:200", "max_split_size_mb:300", "max_split_size_mb:100", "GPUMEM_ALLOC_CONF", 100},
		{"", "max_split_size_mb:200", "max_split_size_mb:300", "max_split_size_mb:200", "PYTORCH_ALLOC_CONF", 200},
		{" ", "", "max_split_size_mb:300", "max_split_size_mb:300", "PYTORCH_CUDA_ALLOC_CONF", 300},
		{"", "\t", "", "", "", 0},
	} {
		set(c.g, c.p, c.pc)
		conf, from := LookupConfEnv()
		assert.Equal(t, c.conf, conf)
		assert.Equal(t, c.from, from)
		cfg, err := ConfigFromEnv()
		require.NoError(t, err)
		assert.Equal(t, c.maxSplitMiB*mib, cfg.MaxSplitSize, "from %s", c.from)
	}
	set("", "bogus:1", "max_split_size_mb:300")
	_, err := ConfigFromEnv()
	require.Error(t, err, "a bad PYTORCH_ALLOC_CONF is not skipped for the next variable")
	assert.Contains(t, err.Error(), `PYTORCH_ALLOC_CONF: allocator: parsing config: unrecognized key "bogus"`)
}
