package viz

import (
	"bytes"
	"encoding/xml"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/replay"
)

func TestReplayAndWriteSVG(t *testing.T) {
	r, err := trace.Open("testdata/pub_cs336_MAGMA27_lm_fwdbwd.trace.gz")
	require.NoError(t, err)
	defer r.Close()
	dev, err := sim.New(sim.Config{})
	require.NoError(t, err)
	a, err := allocator.New(dev, allocator.Config{})
	require.NoError(t, err)
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
