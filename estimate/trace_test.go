package estimate

import (
	"bufio"
	"compress/gzip"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/gpumemtest"
	"github.com/gpumem/gpumem/stats"
)

// measured is what a real run's trace shows once replayed through the
// caching allocator in PyTorch's configuration.
type measured struct {
	peakAllocated int64 // torch.cuda.max_memory_allocated
	peakLive      int64 // the largest sum of live requested bytes
	// beforeStep is the largest live sum before the optimizer step of the
	// steps after the first (the forward and backward peak), when the
	// trace marks steps; see replayTrace.
	beforeStep int64
}

// replayTrace replays a memtrace file's allocations and frees (the only
// lines these traces use besides comments) and measures it. stepStart, if
// non-zero, is the size of the allocation whose second occurrence in a
// step after the first begins the optimizer step.
func replayTrace(t *testing.T, path string, stepStart uint64) measured {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	a := gpumemtest.New(t, gpumemtest.WithDevice(sim.Config{Capacity: 80 << 30, Costs: sim.NoCosts()}), gpumemtest.AllowLeaks())
	type block struct {
		p device.Ptr
		n int64
	}
	live := map[string]block{}
	var m measured
	var cur int64
	step, seen, inStep := -1, 0, false
	sc := bufio.NewScanner(z)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "# mark") {
			step, seen, inStep = step+1, 0, true
			continue
		}
		fs := strings.Fields(line)
		if len(fs) == 0 || strings.HasPrefix(fs[0], "#") {
			continue
		}
		switch fs[0] {
		case "a":
			n, err := strconv.ParseUint(fs[2], 10, 64)
			if err != nil {
				t.Fatalf("%s: %q: %v", path, line, err)
			}
			p, err := a.Alloc(n, device.DefaultStream)
			if err != nil {
				t.Fatal(err)
			}
			live[fs[1]] = block{p, int64(n)}
			cur += int64(n)
			if stepStart != 0 && step >= 1 && n == stepStart {
				if seen++; seen == 2 {
					inStep = false
				}
			}
		case "f":
			b, ok := live[fs[1]]
			if !ok {
				t.Fatalf("%s: free of unknown block: %q", path, line)
			}
			if err := a.Free(b.p); err != nil {
				t.Fatal(err)
			}
			delete(live, fs[1])
			cur -= b.n
		default:
			t.Fatalf("%s: unexpected line %q", path, line)
		}
		m.peakLive = max(m.peakLive, cur)
		if inStep && step >= 1 {
			m.beforeStep = max(m.beforeStep, cur)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	m.peakAllocated = a.Stats().AllocatedBytes[stats.All].Peak
	return m
}

// within fails the test unless got is within tol (a fraction) of want.
func within(t *testing.T, what string, got, want int64, tol float64) {
	t.Helper()
	r := float64(got)/float64(want) - 1
	t.Logf("%s: estimated %s, reference %s (%+.1f%%)", what, FormatBytes(got), FormatBytes(want), 100*r)
	if r < -tol || r > tol {
		t.Errorf("%s: estimated %d bytes, reference %d: off by %+.1f%%, more than ±%.0f%%", what, got, want, 100*r, 100*tol)
	}
}
