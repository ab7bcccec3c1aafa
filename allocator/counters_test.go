package allocator

import (
	"slices"
	"testing"

	"github.com/gpumem/gpumem/allocator/internal/peaks"
	"pgregory.net/rapid"
)

// TestOpDeltaChangesAreOf: an operation's changes to the peaks' rows are
// its nonzero changes by of, in the order of the rows and columns.
func TestOpDeltaChangesAreOf(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		d := opDelta{k: rapid.IntRange(qSmall, qLarge).Draw(t, "pool")}
		for row := range d.row {
			if rapid.Bool().Draw(t, "changed") {
				d.row[row] = rapid.Int64Range(-3, 3).Draw(t, "delta")
			}
		}
		var want []peaks.Change
		for row := range numRows {
			for k := range numQ {
				if v := d.of(row, k); v != 0 {
					want = append(want, peaks.Change{Row: statRow(row, k), Delta: v})
				}
			}
		}
		if got := d.changes(nil); !slices.Equal(got, want) {
			t.Fatalf("changes %v, want %v", got, want)
		}
	})
}
