package allocator

import (
	"math/rand/v2"
	"testing"

	"github.com/gpumem/gpumem/device"
)

// TestLiveTableMatchesAMap runs buildPlanLocked's matching of frees to
// allocations through liveTable and through a map, on addresses that
// share slots (many on one page stride, reused after their free), frees
// of addresses never allocated and double frees: the same position for
// every free.
func TestLiveTableMatchesAMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, 3, 7, 64, 1000} {
		live := newLiveTable(n)
		want := map[device.Ptr]int32{}
		var held []device.Ptr
		for pos := int32(0); int(pos) < n; {
			if len(held) == 0 || rng.IntN(3) > 0 {
				var ptr device.Ptr
				for {
					ptr = device.Ptr(rng.IntN(4*n+4)) << 21 // 2 MiB apart: the hash's input shares its low bits
					if _, ok := want[ptr]; !ok {
						break
					}
				}
				s := live.slot(ptr)
				s.ptr, s.pos = ptr, pos+1
				want[ptr] = pos
				held = append(held, ptr)
				pos++
				continue
			}
			var ptr device.Ptr
			if rng.IntN(4) == 0 {
				ptr = device.Ptr(rng.IntN(4*n+4))<<21 + 512 // likely never allocated
			} else {
				i := rng.IntN(len(held))
				ptr = held[i]
				if rng.IntN(2) == 0 { // else freed twice, later
					held = append(held[:i], held[i+1:]...)
				}
			}
			s := live.find(ptr)
			got := int32(-1)
			if s != nil {
				got = s.pos - 1
				s.pos = 0
			}
			k, ok := want[ptr]
			if ok && got != k || !ok && got != -1 {
				t.Fatalf("n=%d: free of %#x: position %d, want %d (%v)", n, ptr, got, k, ok)
			}
			delete(want, ptr)
		}
	}
}

// TestLiveTableFreesOfOlderBlocks: a step may free many more blocks
// allocated before it than it allocates; their look-ups take no slot, so
// the table of a one-allocation step answers every one of them (none of
// its allocation) instead of filling up.
func TestLiveTableFreesOfOlderBlocks(t *testing.T) {
	live := newLiveTable(1)
	live.slot(1 << 40).pos = 1
	for i := range 10000 {
		if s := live.find(device.Ptr(i+1) << 21); s != nil {
			t.Fatalf("free of an older block %d: found the slot of %#x", i, s.ptr)
		}
	}
	if s := live.find(1 << 40); s == nil || s.pos != 1 {
		t.Fatalf("the step's own block: %+v", s)
	}
}
