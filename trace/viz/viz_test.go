package viz

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/gpumemtest"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/replay"
)

func TestReplayAndWriteSVG(t *testing.T) {
	r, err := trace.Open("testdata/pub_cs336_MAGMA27_lm_fwdbwd.trace.gz")
	require.NoError(t, err)
	defer r.Close()
	a := gpumemtest.New(t)
	pic, res, err := Replay(r, a, replay.Options{Name: "cs336 <step>"})
	require.NoError(t, err)
	require.NotEmpty(t, pic.Samples)
	var peak int64
	for _, s := range pic.Samples {
		peak = max(peak, s.Reserved)
		assert.LessOrEqual(t, s.Requested, s.Allocated)
		assert.LessOrEqual(t, s.Allocated, s.Reserved)
	}
	assert.Equal(t, res.PeakReserved, peak, "the peak falls on a sampled op in this trace")
	var segBytes uint64
	for _, s := range pic.Peak {
		segBytes += s.Size
	}
	assert.EqualValues(t, peak, segBytes, "the segment map is taken at the peak")

	var buf bytes.Buffer
	require.NoError(t, pic.WriteSVG(&buf))
	svg := buf.String()
	assert.True(t, strings.HasPrefix(svg, "<svg"))
	assert.Contains(t, svg, "cs336 &lt;step&gt;", "the title is escaped")
	assert.Equal(t, 3, strings.Count(svg, "<polyline"))
	// Allocated is drawn after requested, which would otherwise hide it.
	req := strings.Index(svg, "<title>requested bytes: highest sample")
	alloc := strings.Index(svg, "<title>allocated bytes: highest sample")
	require.Positive(t, req)
	assert.Greater(t, alloc, req)
	var peakAllocated int64
	for _, s := range pic.Samples {
		peakAllocated = max(peakAllocated, s.Allocated)
	}
	for _, want := range []string{
		fmt.Sprintf("<title>allocated bytes: highest sample 12.97 GiB (%d bytes) after op", peakAllocated),
		">15 GiB</text>",      // round byte ticks
		">2000</text>",        // round op ticks
		"<title>block 0x1000", // blocks have hover titles
		"active_allocated, ",
		"large pool, stream 0",
	} {
		assert.True(t, strings.Contains(svg, want), "the SVG has %q", want)
	}
	d := xml.NewDecoder(strings.NewReader(svg))
	for {
		_, err := d.Token()
		if err == io.EOF {
			break
		}
		require.NoError(t, err, "the SVG is well-formed XML")
	}
}

func TestDownsampleKeepsPeaks(t *testing.T) {
	var s []Sample
	for i := range 1000 {
		s = append(s, Sample{Op: int64(i), Reserved: int64(i % 7)})
	}
	s[500].Reserved = 1000
	out := downsample(s, 100, func(x Sample) int64 { return x.Reserved })
	assert.Len(t, out, 100)
	found := false
	for _, x := range out {
		found = found || x.Reserved == 1000
	}
	assert.True(t, found)
	assert.Len(t, downsample(s[:10], 100, func(x Sample) int64 { return x.Reserved }), 10)
}

func TestRoundTicks(t *testing.T) {
	labels := func(ts []tick) string {
		var l []string
		for _, x := range ts {
			l = append(l, x.label)
		}
		return strings.Join(l, ",")
	}
	for _, c := range []struct {
		max  int64
		want string
	}{
		{14088667136, "0 GiB,5 GiB,10 GiB,15 GiB"}, // 13.1 GiB
		{3 << 30, "0 GiB,1 GiB,2 GiB,3 GiB"},
		{2 << 30, "0 GiB,0.5 GiB,1 GiB,1.5 GiB,2 GiB"},
		{1100 << 20, "0 GiB,0.5 GiB,1 GiB,1.5 GiB"},
		{1 << 20, "0 MiB,0.2 MiB,0.4 MiB,0.6 MiB,0.8 MiB,1 MiB"},
		{700 << 20, "0 MiB,200 MiB,400 MiB,600 MiB,800 MiB"},
		{80 << 30, "0 GiB,20 GiB,40 GiB,60 GiB,80 GiB"},
		{1, "0 B,1 B"},
		{1000, "0 B,200 B,400 B,600 B,800 B,1000 B"},
		{5 << 40, "0 TiB,1 TiB,2 TiB,3 TiB,4 TiB,5 TiB"},
	} {
		ts := byteTicks(c.max)
		assert.Equal(t, c.want, labels(ts), "%d", c.max)
		assert.GreaterOrEqual(t, ts[len(ts)-1].v, c.max, "the axis covers the maximum")
	}
	assert.Equal(t, "0,1000,2000,3000", labels(niceTicks(3900, 1, "", false)), "op ticks stop at the last op")
	assert.Equal(t, "0,1", labels(niceTicks(1, 1, "", false)))
}
