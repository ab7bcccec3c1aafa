// Tests of the free-range treap against a naive list.

package sim

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// naiveSpace is the reference: a sorted list of free ranges, scanned.
type naiveSpace struct{ free [][2]uint64 }

func (n *naiveSpace) take(size uint64) (uint64, bool) {
	for i, r := range n.free {
		if r[1] >= size {
			if r[1] == size {
				n.free = slices.Delete(n.free, i, i+1)
			} else {
				n.free[i] = [2]uint64{r[0] + size, r[1] - size}
			}
			return r[0], true
		}
	}
	return 0, false
}

func (n *naiveSpace) give(start, size uint64) {
	n.free = append(n.free, [2]uint64{start, size})
	slices.SortFunc(n.free, func(a, b [2]uint64) int { return cmpU64(a[0], b[0]) })
	merged := n.free[:1]
	for _, r := range n.free[1:] {
		last := &merged[len(merged)-1]
		if last[0]+last[1] == r[0] {
			last[1] += r[1]
		} else {
			merged = append(merged, r)
		}
	}
	n.free = merged
}

func TestFreeSpaceAgainstNaive(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		const base, total = 1 << 20, 1 << 16
		s := newFreeSpace(base, total)
		ref := &naiveSpace{free: [][2]uint64{{base, total}}}
		var taken [][2]uint64
		t.Repeat(map[string]func(*rapid.T){
			"take": func(t *rapid.T) {
				size := rapid.Uint64Range(1, 4096).Draw(t, "size")
				got, ok := s.take(size)
				want, wok := ref.take(size)
				require.Equal(t, wok, ok)
				require.Equal(t, want, got)
				if ok {
					taken = append(taken, [2]uint64{got, size})
				}
			},
			"give": func(t *rapid.T) {
				if len(taken) == 0 {
					t.Skip("nothing taken")
				}
				i := rapid.IntRange(0, len(taken)-1).Draw(t, "i")
				r := taken[i]
				taken = slices.Delete(taken, i, i+1)
				s.give(r[0], r[1])
				ref.give(r[0], r[1])
			},
			"": func(t *rapid.T) {
				checkSpace(t, &s)
				require.Equal(t, ref.free, s.ranges())
			},
		})
	})
}

func TestFreeSpaceMergesBothSides(t *testing.T) {
	s := newFreeSpace(0, 100)
	a, _ := s.take(10)
	b, _ := s.take(10)
	c, _ := s.take(10)
	require.Equal(t, []uint64{0, 10, 20}, []uint64{a, b, c})
	s.give(a, 10)
	s.give(c, 10) // merges with the tail
	require.Equal(t, [][2]uint64{{0, 10}, {20, 80}}, s.ranges())
	s.give(b, 10) // merges both neighbours
	require.Equal(t, [][2]uint64{{0, 100}}, s.ranges())
	checkSpace(t, &s)
	_, ok := s.take(101)
	require.False(t, ok)
	require.Equal(t, [][2]uint64{{0, 100}}, s.ranges(), "a failed take changes nothing")
}

func TestFreeSpaceRecyclesNodes(t *testing.T) {
	s := newFreeSpace(0, 1<<30)
	var got []uint64
	for range 1000 {
		a, _ := s.take(8)
		got = append(got, a)
	}
	for i := 0; i < len(got); i += 2 {
		s.give(got[i], 8)
	}
	checkSpace(t, &s)
	require.Equal(t, 501, s.count)
	allocs := testing.AllocsPerRun(100, func() {
		a, _ := s.take(8)
		s.give(a, 8)
	})
	require.Zero(t, allocs)
}
