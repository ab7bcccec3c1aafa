package allocator

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/internal/simtest"
)

// oomOf returns the out-of-memory error of a request of n bytes.
func oomOf(t *testing.T, alloc func(uint64, device.Stream) (device.Ptr, error), n uint64) *OutOfMemoryError {
	t.Helper()
	_, err := alloc(n, device.DefaultStream)
	var oom *OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	return oom
}

// TestOutOfMemoryHintFollowsTheConfiguration checks that the error's
// advice names what the configuration has not tried yet, and never
// max_split_size_mb first.
func TestOutOfMemoryHintFollowsTheConfiguration(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
		n    uint64 // the request, on a device of 256 MiB
		hint string
	}{
		{"faithful", Config{}, 300 * mib, hintGeneral},
		{"expandable segments", Config{ExpandableSegments: true}, 300 * mib, hintExpandable},
		{"expandable segments with max_split_size", Config{ExpandableSegments: true, MaxSplitSize: 128 * mib}, 300 * mib, hintSplitExpandable},
		{"max_split_size alone", Config{MaxSplitSize: 128 * mib}, 300 * mib, hintGeneral},
		{"low_fragmentation", Config{Policy: PolicyLowFragmentation}, 300 * mib, fmt.Sprintf(hintPolicy, "low_fragmentation")},
		{"planned with max_split_size", Config{Policy: PolicyPlanned, MaxSplitSize: 128 * mib}, 300 * mib, fmt.Sprintf(hintPolicy, "planned")},
		{"a cap the device could pass", Config{MemoryLimit: 64 * mib}, 100 * mib, hintCap + hintGeneral},
		{"a cap the device could not pass", Config{MemoryLimit: 64 * mib}, 300 * mib, hintGeneral},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, _ := newTest(t, 256*mib, c.cfg)
			oom := oomOf(t, a.Alloc, c.n)
			assert.Equal(t, c.hint, oom.Hint)
			msg := oom.Error()
			assert.True(t, strings.HasSuffix(msg, c.hint), msg)
			if i := strings.Index(msg, "max_split_size_mb"); i >= 0 {
				assert.Contains(t, msg[i:], "unset max_split_size_mb", "max_split_size_mb is named only to unset it")
			}
		})
	}
	t.Run("an error built by hand", func(t *testing.T) {
		assert.True(t, strings.HasSuffix((&OutOfMemoryError{}).Error(), hintGeneral))
	})
	t.Run("no caching", func(t *testing.T) {
		p, err := NewPassthrough(simtest.New(t, simtest.Capacity(64*mib)))
		require.NoError(t, err)
		assert.Equal(t, hintUncached, oomOf(t, p.Alloc, 100*mib).Hint)
	})
	t.Run("backend:cudaMallocAsync", func(t *testing.T) {
		for _, c := range []struct {
			cfg  Config
			n    uint64
			hint string
		}{
			{Config{}, 300 * mib, hintAsync},
			{Config{MemoryLimit: 64 * mib}, 100 * mib, hintCap + hintAsync},
		} {
			a, err := NewAsync(simtest.New(t, simtest.Capacity(256*mib)), c.cfg)
			require.NoError(t, err)
			assert.Equal(t, c.hint, oomOf(t, a.Alloc, c.n).Hint)
		}
	})
}

// TestMaxSplitSizeStrandsExpandableMemory checks what hintSplitExpandable
// says: with expandable segments, a free range of max_split_size or more
// does not serve a smaller request, which maps new memory instead (as in
// PyTorch 2.6); without max_split_size the same range serves it. (A free
// range just below the segment's unmapped end serves it either way: the
// growth of the segment starts there.)
func TestMaxSplitSizeStrandsExpandableMemory(t *testing.T) {
	for _, c := range []struct {
		maxSplit uint64
		grows    bool
	}{{0, false}, {128 * mib, true}} {
		a, _ := newTest(t, 0, Config{ExpandableSegments: true, MaxSplitSize: c.maxSplit})
		p := mustAlloc(t, a, 200*mib, 0)
		guard := mustAlloc(t, a, 20*mib, 0) // between p and the unmapped end
		mustFree(t, a, p)                   // a free range of 200 MiB, mapped
		reserved := get(t, a, "reserved_bytes.all.current")
		q := mustAlloc(t, a, 40*mib, 0)
		grew := get(t, a, "reserved_bytes.all.current") > reserved
		assert.Equal(t, c.grows, grew, "max_split_size %d MiB: reserved %d then %d", c.maxSplit>>20, reserved, get(t, a, "reserved_bytes.all.current"))
		mustFree(t, a, q)
		mustFree(t, a, guard)
	}
}

// TestPoliciesLetAnyFreeRangeServe checks splitRule.anyServes: under the
// low_fragmentation and planned policies with expandable segments, a
// free range of max_split_size or more serves a smaller request (split
// like any other) instead of stranding it, as it does under the faithful
// policy (TestMaxSplitSizeStrandsExpandableMemory); on a device without
// virtual memory, whose segments are whole device allocations, the
// policies keep PyTorch's rule.
func TestPoliciesLetAnyFreeRangeServe(t *testing.T) {
	for _, pol := range []Policy{PolicyLowFragmentation, PolicyPlanned} {
		for _, vm := range []bool{true, false} {
			cfg := Config{Policy: pol, MaxSplitSize: 128 * mib}
			var a *Allocator
			if vm {
				a, _ = newTest(t, 0, cfg)
			} else {
				sd := simtest.New(t)
				a = onDevice(t, device.Compose(sd, device.Capabilities{StreamChecker: sd}), cfg)
			}
			p := mustAlloc(t, a, 200*mib, 0)
			guard := mustAlloc(t, a, 20*mib, 0)
			mustFree(t, a, p)
			reserved := get(t, a, "reserved_bytes.all.current")
			q := mustAlloc(t, a, 40*mib, 0)
			if vm {
				assert.Equal(t, p, q, "%v: the 200 MiB range serves the 40 MiB request", pol)
				assert.Equal(t, reserved, get(t, a, "reserved_bytes.all.current"), "%v: nothing more mapped", pol)
			} else {
				assert.NotEqual(t, p, q, "%v without virtual memory: the oversize segment is not split", pol)
				assert.Greater(t, get(t, a, "reserved_bytes.all.current"), reserved, "%v without virtual memory", pol)
			}
			mustFree(t, a, q)
			mustFree(t, a, guard)
			require.NoError(t, a.CheckInvariants())
		}
	}
}
