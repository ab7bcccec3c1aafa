// This file tests the memory summary against tables that PyTorch's own
// memory_summary code printed (testdata/*.golden, made by make_golden.py).

package stats

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// scenario is one testdata/NAME.json input of make_golden.py.
type scenario struct {
	Device int              `json:"device"`
	Stats  map[string]int64 `json:"stats"`
}

func loadScenario(t *testing.T, name string) (DeviceStats, int) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", name+".json"))
	require.NoError(t, err)
	var sc scenario
	require.NoError(t, json.Unmarshal(raw, &sc))
	require.Len(t, sc.Stats, NumKeys, "a scenario sets every key")
	d, err := FromMap(sc.Stats)
	require.NoError(t, err)
	return d, sc.Device
}

func TestSummaryMatchesPyTorch(t *testing.T) {
	for _, name := range []string{"zeros", "random_mixed", "boundaries", "extremes"} {
		for _, abbreviated := range []bool{false, true} {
			golden := name + ".golden"
			if abbreviated {
				golden = name + ".abbreviated.golden"
			}
			t.Run(golden, func(t *testing.T) {
				d, dev := loadScenario(t, name)
				raw, err := os.ReadFile(filepath.Join("testdata", golden))
				require.NoError(t, err)
				want := strings.Split(string(raw), "\n")

				got := strings.Split(Summary(&d, SummaryOptions{Device: dev, Abbreviated: abbreviated}), "\n")
				require.Len(t, got, len(want))
				for i := range want {
					if i == 1 {
						continue // the title names gpumem instead of PyTorch
					}
					assert.Equal(t, want[i], got[i], "line %d", i+1)
				}
				assert.Equal(t, len(want[1]), len(got[1]), "title line width")
				assert.Equal(t, "gpumem memory summary, device "+strconv.Itoa(dev),
					strings.TrimSpace(strings.Trim(got[1], "|")))
				assert.Contains(t, want[1], "PyTorch CUDA memory summary, device ID "+strconv.Itoa(dev))
			})
		}
	}
}

func TestSummaryShape(t *testing.T) {
	d := distinctStats()
	full := Summary(&d, SummaryOptions{})
	short := Summary(&d, SummaryOptions{Abbreviated: true})
	assert.Equal(t, 47, strings.Count(full, "\n"))
	assert.Equal(t, 29, strings.Count(short, "\n"))
	assert.Equal(t, 9, strings.Count(full, "from large pool"))
	assert.Equal(t, 9, strings.Count(full, "from small pool"))
	assert.NotContains(t, short, "from large pool")
	assert.True(t, strings.HasSuffix(full, "|\n"))
	for _, line := range strings.Split(strings.TrimSuffix(short, "\n"), "\n") {
		assert.Equal(t, summaryWidth+2, utf8.RuneCountInString(line), "%q", line)
	}
}

func TestSummaryNil(t *testing.T) {
	var zero DeviceStats
	assert.Equal(t, Summary(&zero, SummaryOptions{Device: 2}), Summary(nil, SummaryOptions{Device: 2}))
}

func TestSummaryTitle(t *testing.T) {
	for _, tc := range []struct {
		device int
		name   string
		want   string
	}{
		{0, "", "gpumem memory summary, device 0"},
		{1, "NVIDIA H100 80GB HBM3", "gpumem memory summary, device 1 (NVIDIA H100 80GB HBM3)"},
		{7, "sim", "gpumem memory summary, device 7 (sim)"},
		{-1, "", "gpumem memory summary, device -1"},
		{0, strings.Repeat("x", 39), "gpumem memory summary, device 0 (" + strings.Repeat("x", 39) + ")"},
		{0, strings.Repeat("x", 40), "gpumem memory summary, device 0 (" + strings.Repeat("x", 36) + "...)"},
		{0, strings.Repeat("é", 60), "gpumem memory summary, device 0 (" + strings.Repeat("é", 36) + "...)"},
		{0, "bad\nname\t", "gpumem memory summary, device 0 (bad?name?)"},
	} {
		title := summaryTitle(tc.device, tc.name)
		assert.Equal(t, summaryWidth, utf8.RuneCountInString(title), "%q", title)
		assert.Equal(t, tc.want, strings.TrimSpace(title))
		left := len(title) - len(strings.TrimLeft(title, " "))
		right := len(title) - len(strings.TrimRight(title, " "))
		assert.LessOrEqual(t, right-left, 1, "centred: %q", title)
		assert.GreaterOrEqual(t, right-left, 0, "centred: %q", title)
		assert.GreaterOrEqual(t, left, 1, "%q", title)
	}
	// The widest ordinal still leaves room for part of the name.
	huge := summaryTitle(-1<<63, strings.Repeat("n", 80))
	assert.Equal(t, summaryWidth, len(huge))
	assert.Equal(t, "gpumem memory summary, device -9223372036854775808 (nnnnnnnnnnnnnnnnn...)", strings.TrimSpace(huge))
	s := Summary(nil, SummaryOptions{Device: 3, Name: "sim"})
	assert.Contains(t, strings.Split(s, "\n")[1], "gpumem memory summary, device 3 (sim)")
}

func TestSummaryUnits(t *testing.T) {
	type unitCase struct {
		v, pref int64
		want    string
	}
	for _, f := range []struct {
		name   string
		format func(b []byte, v, pref int64) []byte
		cases  []unitCase
	}{
		{"summarySize", appendSummarySize, []unitCase{
			{0, 0, "     0 B  "},
			{786431, 786431, "786431 B  "},
			{786432, 786432, "   768 KiB"},
			{5, 786432, "     0 KiB"},
			{-1, 786432, "    -1 KiB"},
			{-1025, 1 << 30, "    -1 MiB"},
			{1 << 30, 1 << 30, "  1024 MiB"},
			{768 << 30, 768 << 30, "   768 GiB"},
			{768 << 40, 768 << 40, "   768 TiB"},
			{768 << 50, 768 << 50, "   768 PiB"},
			{768<<50 - 1, 768<<50 - 1, "   767 PiB"}, // the float test rounds up to 768 PiB
			{1<<63 - 1, 1<<63 - 1, "  8191 PiB"},
			{1 << 40, 0, "1099511627776 B  "},
		}},
		{"summaryCount", appendSummaryCount, []unitCase{
			{0, 0, "      0   "},
			{749999, 749999, " 749999   "},
			{750000, 750000, "    750 K "},
			{749999999, 749999999, " 749999 K "},
			{750000000, 750000000, "    750 M "},
			{-1, 750000000, "     -1 M "},
			{1<<63 - 1, 1<<63 - 1, "9223372036854 M "},
			{9999999999999, 9999999999999, "9999999 M "},
		}},
	} {
		for _, tc := range f.cases {
			assert.Equal(t, tc.want, string(f.format(nil, tc.v, tc.pref)), "%s(%d, %d)", f.name, tc.v, tc.pref)
		}
	}
}

func TestFloorDiv(t *testing.T) {
	for _, tc := range [][3]int64{
		{7, 2, 3}, {-7, 2, -4}, {-8, 2, -4}, {0, 5, 0}, {-1, 1024, -1},
		{-1 << 63, 1024, -1 << 53}, {1<<63 - 1, 1000, 9223372036854775},
	} {
		assert.Equal(t, tc[2], floorDiv(tc[0], tc[1]), "%d // %d", tc[0], tc[1])
	}
}

// TestSummaryWidthProperty checks that for any consistent stats (pool
// values within their "all" value, counts below 10^13 so that they fit
// seven digits of millions, counters of sane width) every line of the table
// is exactly 77 columns wide.
func TestSummaryWidthProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		const maxCount = 1e13 - 1
		var d DeviceStats
		for m := range NumMetrics {
			a, ai := d.Of(m), int(m)
			limit := int64(1<<63 - 1)
			if !m.IsBytes() { // allocation, segment, active, inactive_split
				limit = maxCount
			}
			for fi := range 4 {
				all := rapid.Int64Range(0, limit).Draw(t, "all"+strconv.Itoa(ai*4+fi))
				large := rapid.Int64Range(0, all).Draw(t, "large")
				*a[All].field(fi) = all
				*a[LargePool].field(fi) = large
				*a[SmallPool].field(fi) = all - large
			}
		}
		for fi := range 4 {
			*d.OversizeAllocations.field(fi) = rapid.Int64Range(0, maxCount).Draw(t, "oa")
			*d.OversizeSegments.field(fi) = rapid.Int64Range(0, maxCount).Draw(t, "os")
		}
		d.NumOOMs = rapid.Int64Range(0, 999999999999).Draw(t, "ooms")
		d.NumAllocRetries = rapid.Int64Range(0, 99999999).Draw(t, "retries")
		abbreviated := rapid.Bool().Draw(t, "abbreviated")
		s := Summary(&d, SummaryOptions{Device: rapid.IntRange(0, 1000).Draw(t, "dev"), Abbreviated: abbreviated})
		for _, line := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
			if len(line) != summaryWidth+2 {
				t.Fatalf("line %q is %d wide", line, len(line))
			}
		}
	})
}

// TestSummarySectionsKeepTheWidth: the phase and leak sections keep every
// line 77 columns wide, whatever the names.
func TestSummarySectionsKeepTheWidth(t *testing.T) {
	d := DeviceStats{}
	long := strings.Repeat("phase-name-", 10)
	s := Summary(&d, SummaryOptions{
		Phases: []PhaseStats{{Name: "forward", AllocatedBytes: Stat{Current: 3 << 30, Peak: 5 << 30}, Allocations: Stat{Current: 12, Allocated: 1200}}, {Name: long + "\x01"}},
		Leaks: []Leak{
			{Phase: "forward", Size: 4096, Alive: []int64{1, 2, 3}, Grew: 2},
			{Site: "github.com/a/b/c.cacheActivation (" + long + ".go:25)", Size: 1 << 20, Alive: []int64{0, 5, 10}, Grew: 2},
			{Size: 1, Alive: []int64{1, 2, 3}, Grew: 2},
		},
	})
	for _, line := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
		assert.Equal(t, summaryWidth+2, utf8.RuneCountInString(line), "%q", line)
	}
	assert.Contains(t, s, "| c.cacheActivation     |")
	assert.Contains(t, s, "|   at c.cacheActivation (phase-name-")
	assert.Contains(t, s, "(no phase)")
	assert.Contains(t, s, "| forward               |   3072 MiB |   5120 MiB |    1200    |      12    |")
}
