// Tests of the free-range treap against the reference model (refSpace).

package sim

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func TestFreeSpaceAgainstReference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		const base, total = 1 << 20, 1 << 16
		s := newFreeSpace(base, total)
		ref := newRefSpace(base, total)
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
