package freeindex

import (
	"testing"

	"pgregory.net/rapid"
)

// TestFibHashFitsItsTable checks that tableShift gives a table of size
// slots exactly size slots (the top bits of a 64-bit product) and that
// fibHash never names a slot past the table, for every table size the
// open-addressing tables use.
func TestFibHashFitsItsTable(t *testing.T) {
	for size := 1; size <= 1<<24; size *= 2 {
		shift := tableShift(size)
		if got := uint64(1) << (64 - uint(shift)); got != uint64(size) {
			t.Fatalf("tableShift(%d) = %d: a table of %d slots", size, shift, got)
		}
	}
	rapid.Check(t, func(t *rapid.T) {
		size := 1 << rapid.IntRange(4, 24).Draw(t, "log2size")
		x := rapid.Uint64().Draw(t, "key")
		if i := fibHash(x, tableShift(size)); i >= uint64(size) {
			t.Fatalf("fibHash(%d) = %d in a table of %d slots", x, i, size)
		}
	})
}
