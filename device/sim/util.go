// This file holds small helpers.

package sim

import (
	"fmt"
	"slices"
	"time"
)

func sortRanges(r []Range) {
	slices.SortFunc(r, func(a, b Range) int {
		switch {
		case a.Ptr < b.Ptr:
			return -1
		case a.Ptr > b.Ptr:
			return 1
		}
		return 0
	})
}

func timeUnits(n uint64) time.Duration { return time.Duration(n) }

func fmtBytes(n uint64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}
