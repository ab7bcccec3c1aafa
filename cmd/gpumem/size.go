// This file holds the parsing of byte sizes on the command line.

package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

var sizeUnits = []struct {
	suffix string
	mult   uint64
}{
	{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
	{"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1},
}

// parseSize reads "80GiB", "512MiB", "1.5GiB", "2GB" or plain bytes.
func parseSize(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	mult := uint64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	if n, err := strconv.ParseUint(t, 10, 64); err == nil {
		if mult > 1 && n > math.MaxUint64/mult {
			return 0, fmt.Errorf("size %q is too large", s)
		}
		return n * mult, nil
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) || f*float64(mult) >= math.MaxUint64 {
		return 0, fmt.Errorf("bad size %q: want bytes or a number with KiB, MiB, GiB or TiB", s)
	}
	return uint64(f * float64(mult)), nil
}

// sizeFlag is a flag.Value holding a byte size.
type sizeFlag struct{ n uint64 }

func (f *sizeFlag) String() string {
	if f == nil {
		return ""
	}
	switch {
	case f.n != 0 && f.n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", f.n>>30)
	case f.n != 0 && f.n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", f.n>>20)
	}
	return strconv.FormatUint(f.n, 10)
}

func (f *sizeFlag) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	if n == 0 {
		return fmt.Errorf("size must be more than 0")
	}
	f.n = n
	return nil
}

// listFlag collects a repeated string flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, " ") }

func (l *listFlag) Set(s string) error {
	*l = append(*l, s)
	return nil
}
