package capi

import (
	"testing"

	"pgregory.net/rapid"

	"github.com/gpumem/gpumem/device"
)

// checkInvariant verifies liveTable's invariant and its count.
func checkInvariant(t *rapid.T, lt *liveTable) {
	mask := len(lt.slots) - 1
	n := 0
	for j, e := range lt.slots {
		if e.key == 0 {
			continue
		}
		n++
		for i := lt.home(e.key); i != j; i = (i + 1) & mask {
			if lt.slots[i].key == 0 {
				t.Fatalf("key %v at %d: empty slot %d between its home %d and it", e.key, j, i, lt.home(e.key))
			}
		}
	}
	if n != lt.n {
		t.Fatalf("count %d, %d entries", lt.n, n)
	}
}

// The table answers as a Go map does, whatever the operations.
func TestLiveTableMatchesMap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		lt := newLiveTable()
		want := map[device.Ptr]device.Stream{}
		// Few distinct keys so that puts, replaces and takes collide; some
		// keys share a home slot.
		key := rapid.Custom(func(t *rapid.T) device.Ptr {
			return device.Ptr(rapid.IntRange(1, 300).Draw(t, "k")) << 9
		})
		for i, n := 0, rapid.IntRange(1, 2000).Draw(t, "ops"); i < n; i++ {
			k := key.Draw(t, "key")
			if rapid.Bool().Draw(t, "put") {
				s := device.Stream(rapid.Uint64Range(0, 3).Draw(t, "s"))
				lt.put(k, s)
				want[k] = s
			} else {
				s, ok := lt.take(k)
				ws, wok := want[k]
				if ok != wok || s != ws {
					t.Fatalf("take(%v) = %v, %v; want %v, %v", k, s, ok, ws, wok)
				}
				delete(want, k)
			}
		}
		checkInvariant(t, lt)
		for k, s := range want {
			got, ok := lt.take(k)
			if !ok || got != s {
				t.Fatalf("take(%v) = %v, %v; want %v", k, got, ok, s)
			}
		}
		if lt.n != 0 {
			t.Fatalf("%d entries left", lt.n)
		}
	})
}
