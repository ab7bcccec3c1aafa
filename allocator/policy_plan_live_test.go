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
			s := live.slot(ptr)
			k, ok := want[ptr]
			if got := s.pos - 1; ok && got != k || !ok && got != -1 {
				t.Fatalf("n=%d: free of %#x: position %d, want %d (%v)", n, ptr, got, k, ok)
			}
			s.pos = 0
			delete(want, ptr)
		}
	}
}
