// This file holds the memory_stats key space: the flat names PyTorch gives
// to every counter of a DeviceStats, and the reads and writes by name.

package stats

import (
	"fmt"
	"iter"
	"sort"
	"strings"
)

// A keyEntry is one key of the key space and where its value lives.
type keyEntry struct {
	name string
	ref  func(d *DeviceStats) *int64
}

// sortedKeys lists every key in byte order, which is the order of PyTorch's
// memory_stats (an OrderedDict built from a sorted list).
var sortedKeys = buildKeys()

func buildKeys() []keyEntry {
	var keys []keyEntry
	for m := range NumMetrics {
		for p := All; p < NumPools; p++ {
			for fi, fn := range fieldNames {
				keys = append(keys, keyEntry{
					name: m.String() + "." + p.String() + "." + fn,
					ref:  func(d *DeviceStats) *int64 { return d.Of(m)[p].field(fi) },
				})
			}
		}
	}
	for _, o := range oversizeStats {
		for fi, fn := range fieldNames {
			keys = append(keys, keyEntry{o.key + "." + fn, func(d *DeviceStats) *int64 { return o.of(d).field(fi) }})
		}
	}
	for _, c := range counterKeys {
		keys = append(keys, keyEntry{c.key, c.of})
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i].name < keys[j].name })
	return keys
}

// NumKeys is the number of keys in the key space: 9 stat arrays of 3 pools
// and 4 fields, 2 oversize stats of 4 fields, and 6 single values.
const NumKeys = 9*3*4 + 2*4 + 6

// Map returns every statistic under the key PyTorch 2.6's
// torch.cuda.memory_stats() gives it, so that tools written against
// PyTorch's dictionary port over unchanged. The map always holds exactly
// NumKeys entries.
//
// Most keys have the form STAT.POOL.FIELD, where POOL is "all",
// "small_pool" or "large_pool" and FIELD is "current", "peak",
// "allocated" (the cumulative sum of increases) or "freed" (the cumulative
// sum of decreases). The stats:
//
//	allocation            blocks handed to callers and not yet freed by them
//	allocated_bytes       bytes of those blocks (rounded block sizes)
//	requested_bytes       bytes callers asked for, for blocks still active
//	active                blocks in use: allocated, or freed by the caller but
//	                      still awaiting events on other streams
//	active_bytes          bytes of active blocks
//	segment               device allocations (cudaMalloc) held by the cache
//	reserved_bytes        bytes of device memory held: segments plus mapped
//	                      pages of expandable segments
//	inactive_split        free blocks that share a segment with other blocks,
//	                      so cannot be released alone ("non-releasable")
//	inactive_split_bytes  bytes of those blocks
//
// Two stats have no pool, only OVERSIZE.FIELD:
//
//	oversize_allocations  active blocks of at least max_split_size bytes
//	oversize_segments     segments of at least max_split_size bytes
//
// And six keys are single values:
//
//	num_alloc_retries     device allocations retried after flushing the cache
//	num_ooms              out-of-memory errors returned
//	num_sync_all_streams  waits for every outstanding stream event
//	num_device_alloc      successful device allocations and page mappings
//	num_device_free       successful device frees and page unmappings
//	max_split_size        the max_split_size setting in bytes, -1 if unlimited
//
// PyTorch's documentation calls the first stat "allocated"; the key it
// actually reports, and the one used here, is "allocation".
func (d DeviceStats) Map() map[string]int64 {
	m := make(map[string]int64, len(sortedKeys))
	for _, k := range sortedKeys {
		m[k.name] = *k.ref(&d)
	}
	return m
}

// Entries yields every key of Map and its value, in sorted key order, which
// is the order of PyTorch's memory_stats. It builds no map.
func (d DeviceStats) Entries() iter.Seq2[string, int64] {
	return func(yield func(string, int64) bool) {
		for _, k := range sortedKeys {
			if !yield(k.name, *k.ref(&d)) {
				return
			}
		}
	}
}

// Keys returns the keys of Map in sorted order, as PyTorch's memory_stats
// orders them. The slice is new on each call; the caller may keep it.
func (DeviceStats) Keys() []string {
	keys := make([]string, len(sortedKeys))
	for i, k := range sortedKeys {
		keys[i] = k.name
	}
	return keys
}

// Get returns the value of one key of Map, such as
// "reserved_bytes.large_pool.peak" or "num_ooms", and whether the key
// exists. It parses the key and builds no map, so it is cheap enough for a
// monitoring loop. An unknown key gives 0, false.
func (d DeviceStats) Get(key string) (int64, bool) {
	p := d.ref(key)
	if p == nil {
		return 0, false
	}
	return *p, true
}

// FromMap builds a DeviceStats from a flat map of memory_stats keys, such as
// the dictionary PyTorch's torch.cuda.memory_stats() returns, dumped as
// JSON. Keys the map lacks stay zero. A key outside the key space is an
// error, and the result is then the zero DeviceStats.
func FromMap(m map[string]int64) (DeviceStats, error) {
	var d DeviceStats
	var unknown []string
	for k, v := range m {
		p := d.ref(k)
		if p == nil {
			unknown = append(unknown, k)
			continue
		}
		*p = v
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return DeviceStats{}, fmt.Errorf("stats: unknown memory_stats key(s) %q", unknown)
	}
	return d, nil
}

// ref returns a pointer to the field that holds key, or nil when key is not
// in the key space.
func (d *DeviceStats) ref(key string) *int64 {
	head, rest, dotted := strings.Cut(key, ".")
	if !dotted {
		for _, c := range counterKeys {
			if c.key == key {
				return c.of(d)
			}
		}
		return nil
	}
	var s *Stat
	for _, o := range oversizeStats {
		if o.key == head {
			s = o.of(d)
		}
	}
	if s == nil {
		a := d.metricNamed(head)
		if a == nil {
			return nil
		}
		var pool string
		pool, rest, dotted = strings.Cut(rest, ".")
		if !dotted {
			return nil
		}
		switch pool {
		case "all":
			s = &a[All]
		case "small_pool":
			s = &a[SmallPool]
		case "large_pool":
			s = &a[LargePool]
		default:
			return nil
		}
	}
	for i, f := range fieldNames {
		if f == rest {
			return s.field(i)
		}
	}
	return nil
}

// metricNamed returns the StatArray whose key segment is name, or nil.
func (d *DeviceStats) metricNamed(name string) *StatArray {
	for m := range NumMetrics {
		if metrics[m].key == name {
			return d.Of(m)
		}
	}
	return nil
}

// Allocated returns the bytes of blocks currently handed to callers
// (allocated_bytes.all.current), PyTorch's memory_allocated().
func (d DeviceStats) Allocated() int64 { return d.AllocatedBytes[All].Current }

// Reserved returns the bytes of device memory the allocator currently holds
// (reserved_bytes.all.current), PyTorch's memory_reserved().
func (d DeviceStats) Reserved() int64 { return d.ReservedBytes[All].Current }

// MaxAllocated returns the peak of Allocated since the last peak reset
// (allocated_bytes.all.peak), PyTorch's max_memory_allocated().
func (d DeviceStats) MaxAllocated() int64 { return d.AllocatedBytes[All].Peak }

// MaxReserved returns the peak of Reserved since the last peak reset
// (reserved_bytes.all.peak), PyTorch's max_memory_reserved().
func (d DeviceStats) MaxReserved() int64 { return d.ReservedBytes[All].Peak }
