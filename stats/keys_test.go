// This file tests the memory_stats key space: names, reads and writes.

package stats

import (
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// pytorchKeys is every key of torch.cuda.memory_stats() as PyTorch 2.6
// reported it for the random_mixed trace, in PyTorch's order.
var pytorchKeys = []string{
	"active.all.allocated",
	"active.all.current",
	"active.all.freed",
	"active.all.peak",
	"active.large_pool.allocated",
	"active.large_pool.current",
	"active.large_pool.freed",
	"active.large_pool.peak",
	"active.small_pool.allocated",
	"active.small_pool.current",
	"active.small_pool.freed",
	"active.small_pool.peak",
	"active_bytes.all.allocated",
	"active_bytes.all.current",
	"active_bytes.all.freed",
	"active_bytes.all.peak",
	"active_bytes.large_pool.allocated",
	"active_bytes.large_pool.current",
	"active_bytes.large_pool.freed",
	"active_bytes.large_pool.peak",
	"active_bytes.small_pool.allocated",
	"active_bytes.small_pool.current",
	"active_bytes.small_pool.freed",
	"active_bytes.small_pool.peak",
	"allocated_bytes.all.allocated",
	"allocated_bytes.all.current",
	"allocated_bytes.all.freed",
	"allocated_bytes.all.peak",
	"allocated_bytes.large_pool.allocated",
	"allocated_bytes.large_pool.current",
	"allocated_bytes.large_pool.freed",
	"allocated_bytes.large_pool.peak",
	"allocated_bytes.small_pool.allocated",
	"allocated_bytes.small_pool.current",
	"allocated_bytes.small_pool.freed",
	"allocated_bytes.small_pool.peak",
	"allocation.all.allocated",
	"allocation.all.current",
	"allocation.all.freed",
	"allocation.all.peak",
	"allocation.large_pool.allocated",
	"allocation.large_pool.current",
	"allocation.large_pool.freed",
	"allocation.large_pool.peak",
	"allocation.small_pool.allocated",
	"allocation.small_pool.current",
	"allocation.small_pool.freed",
	"allocation.small_pool.peak",
	"inactive_split.all.allocated",
	"inactive_split.all.current",
	"inactive_split.all.freed",
	"inactive_split.all.peak",
	"inactive_split.large_pool.allocated",
	"inactive_split.large_pool.current",
	"inactive_split.large_pool.freed",
	"inactive_split.large_pool.peak",
	"inactive_split.small_pool.allocated",
	"inactive_split.small_pool.current",
	"inactive_split.small_pool.freed",
	"inactive_split.small_pool.peak",
	"inactive_split_bytes.all.allocated",
	"inactive_split_bytes.all.current",
	"inactive_split_bytes.all.freed",
	"inactive_split_bytes.all.peak",
	"inactive_split_bytes.large_pool.allocated",
	"inactive_split_bytes.large_pool.current",
	"inactive_split_bytes.large_pool.freed",
	"inactive_split_bytes.large_pool.peak",
	"inactive_split_bytes.small_pool.allocated",
	"inactive_split_bytes.small_pool.current",
	"inactive_split_bytes.small_pool.freed",
	"inactive_split_bytes.small_pool.peak",
	"max_split_size",
	"num_alloc_retries",
	"num_device_alloc",
	"num_device_free",
	"num_ooms",
	"num_sync_all_streams",
	"oversize_allocations.allocated",
	"oversize_allocations.current",
	"oversize_allocations.freed",
	"oversize_allocations.peak",
	"oversize_segments.allocated",
	"oversize_segments.current",
	"oversize_segments.freed",
	"oversize_segments.peak",
	"requested_bytes.all.allocated",
	"requested_bytes.all.current",
	"requested_bytes.all.freed",
	"requested_bytes.all.peak",
	"requested_bytes.large_pool.allocated",
	"requested_bytes.large_pool.current",
	"requested_bytes.large_pool.freed",
	"requested_bytes.large_pool.peak",
	"requested_bytes.small_pool.allocated",
	"requested_bytes.small_pool.current",
	"requested_bytes.small_pool.freed",
	"requested_bytes.small_pool.peak",
	"reserved_bytes.all.allocated",
	"reserved_bytes.all.current",
	"reserved_bytes.all.freed",
	"reserved_bytes.all.peak",
	"reserved_bytes.large_pool.allocated",
	"reserved_bytes.large_pool.current",
	"reserved_bytes.large_pool.freed",
	"reserved_bytes.large_pool.peak",
	"reserved_bytes.small_pool.allocated",
	"reserved_bytes.small_pool.current",
	"reserved_bytes.small_pool.freed",
	"reserved_bytes.small_pool.peak",
	"segment.all.allocated",
	"segment.all.current",
	"segment.all.freed",
	"segment.all.peak",
	"segment.large_pool.allocated",
	"segment.large_pool.current",
	"segment.large_pool.freed",
	"segment.large_pool.peak",
	"segment.small_pool.allocated",
	"segment.small_pool.current",
	"segment.small_pool.freed",
	"segment.small_pool.peak",
}

func TestKeysArePyTorchKeys(t *testing.T) {
	var d DeviceStats
	require.Len(t, pytorchKeys, NumKeys)
	assert.Equal(t, pytorchKeys, d.Keys(), "Keys must list PyTorch's keys in PyTorch's order")

	m := d.Map()
	require.Len(t, m, len(pytorchKeys))
	for _, k := range pytorchKeys {
		_, ok := m[k]
		assert.True(t, ok, "Map lacks %q", k)
		_, ok = d.Get(k)
		assert.True(t, ok, "Get does not know %q", k)
	}
	var entries []string
	for k := range d.Entries() {
		entries = append(entries, k)
	}
	assert.Equal(t, pytorchKeys, entries)
	assert.True(t, sort.StringsAreSorted(d.Keys()))
}

func TestKeysReturnsFreshSlice(t *testing.T) {
	var d DeviceStats
	k := d.Keys()
	k[0] = "changed"
	assert.Equal(t, "active.all.allocated", d.Keys()[0])
}

// distinctStats gives every field of a DeviceStats its own value, so that a
// key that reads the wrong field is caught.
func distinctStats() DeviceStats {
	var d DeviceStats
	v := int64(1)
	for m := range NumMetrics {
		a := d.Of(m)
		for p := range a {
			s := &a[p]
			s.Current, s.Peak, s.Allocated, s.Freed = v, v+1, v+2, v+3
			v += 4
		}
	}
	for _, s := range []*Stat{&d.OversizeAllocations, &d.OversizeSegments} {
		s.Current, s.Peak, s.Allocated, s.Freed = v, v+1, v+2, v+3
		v += 4
	}
	d.NumAllocRetries, d.NumOOMs, d.NumSyncAllStreams = v, v+1, v+2
	d.NumDeviceAlloc, d.NumDeviceFree, d.MaxSplitSize = v+3, v+4, -1
	return d
}

func TestKeysReadTheRightField(t *testing.T) {
	d := distinctStats()
	want := map[string]int64{
		"allocation.all.current":               d.Allocation[All].Current,
		"allocation.small_pool.peak":           d.Allocation[SmallPool].Peak,
		"segment.large_pool.freed":             d.Segment[LargePool].Freed,
		"active.small_pool.allocated":          d.Active[SmallPool].Allocated,
		"inactive_split.all.peak":              d.InactiveSplit[All].Peak,
		"allocated_bytes.all.peak":             d.AllocatedBytes[All].Peak,
		"reserved_bytes.large_pool.current":    d.ReservedBytes[LargePool].Current,
		"active_bytes.large_pool.freed":        d.ActiveBytes[LargePool].Freed,
		"inactive_split_bytes.small_pool.peak": d.InactiveSplitBytes[SmallPool].Peak,
		"requested_bytes.all.allocated":        d.RequestedBytes[All].Allocated,
		"oversize_allocations.freed":           d.OversizeAllocations.Freed,
		"oversize_segments.current":            d.OversizeSegments.Current,
		"num_alloc_retries":                    d.NumAllocRetries,
		"num_ooms":                             d.NumOOMs,
		"num_sync_all_streams":                 d.NumSyncAllStreams,
		"num_device_alloc":                     d.NumDeviceAlloc,
		"num_device_free":                      d.NumDeviceFree,
		"max_split_size":                       -1,
	}
	m := d.Map()
	for k, v := range want {
		got, ok := d.Get(k)
		assert.True(t, ok, k)
		assert.Equal(t, v, got, "Get(%q)", k)
		assert.Equal(t, v, m[k], "Map()[%q]", k)
	}
	// Every field is distinct, so distinct keys must give distinct values.
	seen := map[int64]string{}
	for k, v := range m {
		if other, dup := seen[v]; dup {
			t.Errorf("keys %q and %q read the same field", k, other)
		}
		seen[v] = k
	}
	for k, v := range d.Entries() {
		assert.Equal(t, m[k], v, k)
	}

	assert.Equal(t, d.AllocatedBytes[All].Current, d.Allocated())
	assert.Equal(t, d.ReservedBytes[All].Current, d.Reserved())
	assert.Equal(t, d.AllocatedBytes[All].Peak, d.MaxAllocated())
	assert.Equal(t, d.ReservedBytes[All].Peak, d.MaxReserved())
	assert.Equal(t, m["allocated_bytes.all.current"], d.Allocated())
	assert.Equal(t, m["reserved_bytes.all.peak"], d.MaxReserved())
}

func TestGetUnknownKeys(t *testing.T) {
	d := distinctStats()
	for _, k := range []string{
		"", ".", "..", "num_oom", "num_ooms.", "num_ooms.current", "allocation",
		"allocation.all", "allocation.all.", "allocation.all.current.x",
		"allocation.medium_pool.current", "allocation.all.total",
		"allocated.all.current", // PyTorch's docs use this name; its dict does not
		"oversize_allocations", "oversize_allocations.all.current",
		"oversize_segments.peak.", "Allocation.all.current", "max_split_size_mb",
		" num_ooms", "reserved_bytes.all.current ",
	} {
		v, ok := d.Get(k)
		assert.False(t, ok, "Get(%q) should not know the key", k)
		assert.Zero(t, v, k)
	}
}

func TestEntriesStopsEarly(t *testing.T) {
	var d DeviceStats
	n := 0
	for range d.Entries() {
		n++
		if n == 3 {
			break
		}
	}
	assert.Equal(t, 3, n)
}

func TestFromMapRoundTrip(t *testing.T) {
	d := distinctStats()
	got, err := FromMap(d.Map())
	require.NoError(t, err)
	assert.Equal(t, d, got)

	partial, err := FromMap(map[string]int64{"num_ooms": 4, "segment.small_pool.peak": 9})
	require.NoError(t, err)
	want := DeviceStats{NumOOMs: 4}
	want.Segment[SmallPool].Peak = 9
	assert.Equal(t, want, partial)
}

func TestFromMapRejectsUnknownKeys(t *testing.T) {
	got, err := FromMap(map[string]int64{"num_ooms": 4, "bogus": 1, "allocated.all.current": 2})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `"allocated.all.current" "bogus"`)
	assert.Equal(t, DeviceStats{}, got, "nothing is returned on error")
}

// TestKeySpaceProperties checks, for random stats, that Map, Get, Entries
// and FromMap agree.
func TestKeySpaceProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		vals := rapid.SliceOfN(rapid.Int64(), NumKeys, NumKeys).Draw(t, "values")
		in := make(map[string]int64, NumKeys)
		for i, k := range pytorchKeys {
			in[k] = vals[i]
		}
		d, err := FromMap(in)
		if err != nil {
			t.Fatal(err)
		}
		m := d.Map()
		if len(m) != NumKeys {
			t.Fatalf("Map has %d keys", len(m))
		}
		for k, v := range in {
			if m[k] != v {
				t.Fatalf("Map()[%q] = %d, want %d", k, m[k], v)
			}
			if g, ok := d.Get(k); !ok || g != v {
				t.Fatalf("Get(%q) = %d, %v, want %d", k, g, ok, v)
			}
		}
		key := rapid.SampledFrom(pytorchKeys).Draw(t, "key")
		cut := rapid.IntRange(0, len(key)-1).Draw(t, "cut")
		if _, ok := d.Get(key[:cut]); ok && !strings.HasPrefix(key, key[:cut]) {
			t.Fatalf("prefix %q of %q accepted", key[:cut], key)
		}
	})
}

func TestAddSumsEveryKeyButTheSetting(t *testing.T) {
	a, b := distinctStats(), distinctStats()
	b.MaxSplitSize = 128 << 20
	sum := a
	sum.Add(&b)
	for k, v := range a.Entries() {
		got, _ := sum.Get(k)
		if k == "max_split_size" {
			assert.Equal(t, v, got, "the setting stays the receiver's")
			continue
		}
		w, _ := b.Get(k)
		assert.Equal(t, v+w, got, k)
	}
}

func TestResetsFollowTheTable(t *testing.T) {
	d := distinctStats()
	d.ResetAccumulated()
	for k, v := range d.Entries() {
		switch {
		case k == "max_split_size":
			assert.EqualValues(t, -1, v, "a setting survives the reset")
		case strings.HasSuffix(k, ".allocated"), strings.HasSuffix(k, ".freed"), strings.HasPrefix(k, "num_"):
			assert.Zero(t, v, k)
		default:
			assert.NotZero(t, v, k)
		}
	}
	d = distinctStats()
	d.ResetPeak()
	for k, v := range d.Entries() {
		if cur, ok := strings.CutSuffix(k, ".peak"); ok {
			c, _ := d.Get(cur + ".current")
			assert.Equal(t, c, v, k)
		}
	}
}

func TestMetricTable(t *testing.T) {
	var d DeviceStats
	seen := map[*StatArray]bool{}
	for m := range NumMetrics {
		a := d.Of(m)
		require.NotNil(t, a, m.String())
		assert.False(t, seen[a], "%s shares its array", m)
		seen[a] = true
		assert.Equal(t, strings.HasSuffix(m.String(), "_bytes"), m.IsBytes(), m.String())
	}
	assert.Nil(t, d.Of(NumMetrics))
	assert.Equal(t, "unknown", NumMetrics.String())
	assert.Same(t, &d.ReservedBytes, d.Of(ReservedBytes))
}
