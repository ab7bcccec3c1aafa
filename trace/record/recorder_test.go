// Tests of Recorder: a recording replays to the same stats.

package record

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/gpumemtest"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/replay"
)

// TestRecorderRoundTrip records an allocator's work as memtrace, replays
// the recording on a fresh allocator and expects the same stats.
func TestRecorderRoundTrip(t *testing.T) {
	a := gpumemtest.New(t)
	dev := a.Device().(*sim.Device)
	side, err := dev.NewStream()
	require.NoError(t, err)
	// Replays hold streams other than 0 busy until an s or S line; so does
	// the recorded run, so that both see the same pending frees.
	require.NoError(t, dev.SetStreamBusy(side, true))
	var buf bytes.Buffer
	w := trace.NewWriter(&buf, "recorded by a test")
	rec := New(w, Options{Stacks: true})
	detach := a.Attach(rec)
	require.NoError(t, rec.Mark("step0"))
	assert.Error(t, rec.Mark("two words"), "a mark's name is one field")
	assert.Error(t, rec.Tag("two words"), "so is a tag")
	require.NoError(t, rec.Err(), "a refused mark or tag does not stop the Recorder")
	require.NoError(t, rec.Tag("forward"))
	var live []device.Ptr
	for i := range 200 {
		p, err := a.Alloc(uint64(i*37_000+1), device.Stream(i%2)*side)
		require.NoError(t, err)
		live = append(live, p)
		if i%3 == 0 {
			require.NoError(t, a.RecordStream(live[0], side))
			require.NoError(t, a.Free(live[0]))
			live = live[1:]
		}
		if i%50 == 49 {
			require.NoError(t, a.EmptyCache())
		}
	}
	require.NoError(t, dev.Synchronize())
	require.NoError(t, rec.SyncDevice())
	stacks := rec.LiveBlocks()
	assert.Len(t, stacks, len(live))
	for _, s := range stacks {
		assert.NotEmpty(t, s.Stack, "stacks are kept")
	}
	for _, p := range live {
		require.NoError(t, a.Free(p))
	}
	detach()
	require.NoError(t, rec.Flush())
	assert.Empty(t, rec.LiveBlocks())

	r, err := trace.NewReader(&buf)
	require.NoError(t, err)
	a2 := gpumemtest.New(t)
	res, err := replay.Run(r, a2, a2.Device().(*sim.Device), replay.Options{})
	require.NoError(t, err)
	want := a.Stats().Map()
	for k, v := range want {
		assert.Equal(t, v, res.Stats[k], "stats[%s]", k)
	}
}
