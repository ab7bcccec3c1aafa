// This file holds the arithmetic of sizes (saturating, so that an absurd
// shape is a size that does not fit rather than an overflow) and the
// reading and writing of parameter counts.

package estimate

import (
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"

	"github.com/gpumem/gpumem/internal/quote"
	"github.com/gpumem/gpumem/stats"
)

// capBytes is where sizes saturate: 4 EiB, more than any device holds.
const capBytes = 1 << 62

// mul multiplies, saturating at capBytes.
func mul(xs ...uint64) uint64 {
	r := uint64(1)
	for _, x := range xs {
		hi, lo := bits.Mul64(r, x)
		if hi != 0 || lo > capBytes {
			return capBytes
		}
		r = lo
	}
	return r
}

// add adds, saturating at capBytes.
func add(xs ...uint64) uint64 {
	var r uint64
	for _, x := range xs {
		r += min(x, capBytes)
		if r > capBytes {
			return capBytes
		}
	}
	return r
}

// ceilDiv returns ⌈a / b⌉ for b > 0.
func ceilDiv(a, b uint64) uint64 {
	if b == 0 {
		return a
	}
	return a/b + min(a%b, 1)
}

var countSuffixes = []struct {
	s string
	v float64
}{{"T", 1e12}, {"B", 1e9}, {"G", 1e9}, {"M", 1e6}, {"K", 1e3}}

// ParseCount reads a parameter count: "7B", "1.3B", "350M", "7e9" or
// "7000000000" (K, M, B or G, T; case-insensitive).
func ParseCount(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := 1.0
	for _, u := range countSuffixes {
		if len(t) > 1 && strings.EqualFold(t[len(t)-1:], u.s) {
			t, mult = t[:len(t)-1], u.v
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	n := f * mult
	if err != nil || math.IsNaN(n) || math.IsInf(n, 0) {
		return 0, fmt.Errorf("bad parameter count %s: want a number such as 7e9, 7B or 1.3B", quote.Quote(s))
	}
	if n < 1 || n > MaxParameters {
		return 0, fmt.Errorf("parameter count %s must be 1..%g", quote.Quote(s), float64(MaxParameters))
	}
	return int64(math.Round(n)), nil
}

// FormatCount writes a parameter count the way papers do: 124.4M, 6.74B.
func FormatCount(n int64) string {
	f := float64(n)
	switch {
	case f >= 1e12:
		return strconv.FormatFloat(f/1e12, 'f', 2, 64) + "T"
	case f >= 1e9:
		return strconv.FormatFloat(f/1e9, 'f', 2, 64) + "B"
	case f >= 1e6:
		return strconv.FormatFloat(f/1e6, 'f', 1, 64) + "M"
	case f >= 1e3:
		return strconv.FormatFloat(f/1e3, 'f', 1, 64) + "K"
	}
	return strconv.FormatInt(n, 10)
}

// FormatBytes writes a byte count in binary units (12.50 GiB).
func FormatBytes(n int64) string {
	if n < 0 {
		return "-" + stats.FormatSize(uint64(-n))
	}
	return stats.FormatSize(uint64(n))
}
