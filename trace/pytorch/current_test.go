// Tests of ReadSnapshot on snapshots laid out as current PyTorch writes
// them (testdata/gen_current.py makes the files): protocol 5, the keys
// added since 2.6, and snapshots without a trace.

package pytorch

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/nlpodyssey/gopickle/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/internal/tracetest"
)

// A protocol-5 snapshot with every current key imports: the new keys are
// ignored, the oom entry (device_free in place of addr) and the
// segment_map, segment_unmap and snapshot actions make no op, and an
// action this importer does not know is skipped with a warning in the
// notes.
func TestSnapshotCurrentLayout(t *testing.T) {
	im, err := readSnapshotFile(t, "testdata/current.pickle.gz", SnapshotOptions{})
	require.NoError(t, err)
	want := []trace.Op{
		// Up front, by address: the block active at the end that the
		// window never saw (0x7100000000, on stream S1) and the block
		// freed in the window that it never allocated (0x7200000000, S2).
		{Kind: trace.Alloc, ID: 0, Size: 400, Stream: 1},
		{Kind: trace.Alloc, ID: 1, Size: 300, Stream: 2},
		// The window.
		{Kind: trace.Alloc, ID: 2, Size: 8000000, Stream: 0},
		{Kind: trace.Free, ID: 1},
		{Kind: trace.Alloc, ID: 3, Size: 1000, Stream: 1},
		{Kind: trace.Alloc, ID: 4, Size: 4000000, Stream: 0},
		{Kind: trace.Free, ID: 4},
		{Kind: trace.Alloc, ID: 5, Size: 64, Stream: 0},
		{Kind: trace.Free, ID: 5},
		// Survivors, by ID: 3 is active_pending_free.
		{Kind: trace.Free, ID: 0},
		{Kind: trace.Free, ID: 2},
		{Kind: trace.Free, ID: 3},
	}
	assert.Equal(t, want, im.Ops)
	assert.Equal(t, 2, im.WindowStart)
	assert.Equal(t, 9, im.WindowEnd)
	assert.Equal(t, 1, im.PreWindowFreed)
	assert.Equal(t, 1, im.PreWindowLive)
	assert.Equal(t, 18, im.Events)
	assert.Equal(t, map[string]int{"free_requested": 3, "oom": 1, "segment_alloc": 1, "segment_free": 1,
		"segment_map": 2, "segment_unmap": 1, "snapshot": 1, "some_action_of_tomorrow": 1}, im.Ignored)
	notes := strings.Join(im.Notes, "\n")
	assert.Contains(t, notes, "warning: actions this importer does not know, skipped: some_action_of_tomorrow=1")
	assert.NotContains(t, notes, "skipped: oom", "a known action is no warning")
	assert.Contains(t, notes, "1 out-of-memory events")
	assert.Contains(t, notes, "segments of device 0: 2 (1 expandable), 23068672 bytes reserved, 3 active blocks of 8001400 bytes requested")
	assert.Contains(t, notes, "'graph_capture_record_stream_reuse': False")
	assert.Contains(t, notes, "'PYTORCH_CUDA_ALLOC_CONF': 'expandable_segments:True'")
	assert.Zero(t, tracetest.Live(t, im.Ops), "an import ends with nothing live")

	// Device 1's trace is empty: its live block is the whole import.
	im, err = readSnapshotFile(t, "testdata/current.pickle.gz", SnapshotOptions{Device: 1})
	require.NoError(t, err)
	assert.Equal(t, []trace.Op{{Kind: trace.Alloc, ID: 0, Size: 1500}, {Kind: trace.Free, ID: 0}}, im.Ops)
	assert.Contains(t, im.Notes[0], "without a trace (an empty device_traces[1]")
}

// A snapshot taken without memory history (device_traces of empty lists,
// no device_traces at all, or torch.cuda.memory_snapshot()'s bare list of
// segments) imports the state at the snapshot: each active block
// allocated, by address, then freed, and the notes say so.
func TestSnapshotWithoutTrace(t *testing.T) {
	dev0 := []trace.Op{
		{Kind: trace.Alloc, ID: 0, Size: 8000000, Stream: 0},
		{Kind: trace.Alloc, ID: 1, Size: 400, Stream: 1},
		{Kind: trace.Alloc, ID: 2, Size: 1000, Stream: 1},
		{Kind: trace.Free, ID: 0},
		{Kind: trace.Free, ID: 1},
		{Kind: trace.Free, ID: 2},
	}
	dev1 := []trace.Op{{Kind: trace.Alloc, ID: 0, Size: 1500}, {Kind: trace.Free, ID: 0}}
	for _, c := range []struct{ file, missing string }{
		{"current_notrace.pickle.gz", "an empty device_traces[0]"},
		{"current_nokey.pickle.gz", "no device_traces"},
		{"memory_snapshot.pickle.gz", "no device_traces"},
	} {
		t.Run(c.file, func(t *testing.T) {
			im, err := readSnapshotFile(t, "testdata/"+c.file, SnapshotOptions{})
			require.NoError(t, err)
			assert.Equal(t, dev0, im.Ops)
			assert.Equal(t, 3, im.WindowStart)
			assert.Equal(t, 3, im.WindowEnd)
			assert.Equal(t, 3, im.PreWindowLive)
			assert.Equal(t, 0, im.Events)
			assert.Contains(t, im.Notes[0], "of device 0 without a trace ("+c.missing+": memory history was not recorded)")
			assert.Contains(t, im.Notes[0], "a replay shows the state at the snapshot")

			im, err = readSnapshotFile(t, "testdata/"+c.file, SnapshotOptions{Device: 1})
			require.NoError(t, err)
			assert.Equal(t, dev1, im.Ops)

			_, err = readSnapshotFile(t, "testdata/"+c.file, SnapshotOptions{Device: 2})
			require.Error(t, err)
			assert.Contains(t, err.Error(), "device 2: the snapshot has")
			assert.Contains(t, err.Error(), "and no segments of that device: nothing to import")
		})
	}
}

// What Python's pickle writes at protocol 5 for bytes held in a bytearray
// or a PickleBuffer decodes; a buffer written out of band (NEXT_BUFFER)
// cannot be, since a file does not carry it, and says so.
func TestPickleProtocol5Buffers(t *testing.T) {
	dec := func(h string) (any, error) {
		data, err := hex.DecodeString(h)
		require.NoError(t, err)
		return loadPickle(data)
	}
	// pickle.dumps(bytearray(b"ab"), protocol=5): FRAME, BYTEARRAY8, MEMOIZE.
	v, err := dec("8005950d000000000000009602000000000000006162942e")
	require.NoError(t, err)
	require.IsType(t, &types.ByteArray{}, v)
	assert.Equal(t, "ab", string(*v.(*types.ByteArray)))
	// pickle.dumps(pickle.PickleBuffer(b"ab"), protocol=5): in band, as bytes.
	v, err = dec("800595060000000000000043026162942e")
	require.NoError(t, err)
	assert.Equal(t, []byte("ab"), v)
	// READONLY_BUFFER on bytes in band is a no-op, on a bytearray gives bytes.
	v, err = dec("80054302616298" + "2e")
	require.NoError(t, err)
	assert.Equal(t, []byte("ab"), v)
	v, err = dec("800596020000000000000061629898" + "2e")
	require.NoError(t, err)
	assert.Equal(t, []byte("ab"), v)
	// pickle.dumps(pickle.PickleBuffer(b"ab"), protocol=5, buffer_callback=lambda b: False).
	_, err = dec("800597982e")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "NEXT_BUFFER at byte 2")
	assert.Contains(t, err.Error(), "out-of-band buffer")
	_, err = dec("8005" + "4b01" + "98" + "2e") // READONLY_BUFFER of an int
	assert.ErrorContains(t, err, "a read-only view of a int")
}

// Hostile protocol-5 lengths: a FRAME or a BYTEARRAY8 that claims more
// than the size limit is refused before anything is allocated for it, and
// one within the size limit but beyond the memory limit too; a FRAME
// inside another is refused as Python refuses it.
func TestPickleProtocol5HugeLengths(t *testing.T) {
	frame := []byte{0x80, 5, 0x95, 0, 0, 0, 0, 0, 0, 0, 0x40, ']', '.'} // FRAME of 2^62 bytes
	hostile(t, bytes.NewReader(frame), SnapshotOptions{}, "a frame of 4611686018427387904 bytes runs past the limit of the pickle's size", mib)
	ba := []byte{0x80, 5, 0x96, 0, 0, 0, 0, 0, 1, 0, 0, 'x', '.'} // BYTEARRAY8 of 2^40 bytes
	hostile(t, bytes.NewReader(ba), SnapshotOptions{}, "BYTEARRAY8 at byte 2: a length of 1099511627776 bytes runs past the limit", mib)
	// 512 MiB is within the default size limit (1 GiB) but not within a
	// 64 MiB memory limit: refused before the buffer is made.
	ba = []byte{0x80, 5, 0x96, 0, 0, 0, 0x20, 0, 0, 0, 0, 'x', '.'}
	hostile(t, bytes.NewReader(ba), SnapshotOptions{MaxMemory: 64 * mib}, "BYTEARRAY8 at byte 2: the decoded values need more than 67108864 bytes", mib)
	// A new FRAME 3 bytes into a frame of 10.
	nested := []byte{0x80, 5, 0x95, 10, 0, 0, 0, 0, 0, 0, 0, ']', 0x95, 1, 0, 0, 0, 0, 0, 0, 0, '.'}
	hostile(t, bytes.NewReader(nested), SnapshotOptions{}, "a frame begins 9 bytes before the end of the frame before it", mib)
}
