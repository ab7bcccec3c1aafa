// Tests of how Run reads its ops: batched from a *trace.Reader, or one at
// a time from any other OpReader, to the same replay.

package replay

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/stats"
	"github.com/gpumem/gpumem/trace"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// oneAtATime hides a Reader's NextBatch, so that Run reads it op by op.
type oneAtATime struct{ trace.OpReader }

// TestBatchedReadSameReplay: a trace replayed from a Reader (batched) and
// op by op gives the same Result, with every batch size, a stop, marks
// and the peak search; and the same progress calls and marks seen.
func TestBatchedReadSameReplay(t *testing.T) {
	data, err := os.ReadFile("testdata/bert_b2.trace.gz")
	require.NoError(t, err)
	type seen struct {
		progress []int64
		marks    []string
	}
	run := func(batched bool, opt Options) (*Result, seen) {
		rd, err := trace.NewReader(bytes.NewReader(data))
		require.NoError(t, err)
		var r trace.OpReader = rd
		if !batched {
			r = oneAtATime{rd}
		}
		var s seen
		opt.Progress = func(n int64) { s.progress = append(s.progress, n) }
		if opt.Mark != nil {
			opt.Mark = func(name string) { s.marks = append(s.marks, name) }
		}
		a, dev := newAllocator(t, 0, allocator.Config{})
		res, err := Run(r, a, dev, opt)
		require.NoError(t, err)
		res.NsPerOp, res.ReplaySeconds = 0, 0
		return res, s
	}
	for _, opt := range []Options{
		{},
		{Batch: 1},
		{Batch: 7, Peak: true},
		{Batch: 100, StopAfter: 1234},
		{StopAfter: 2048},
		{Batch: 50, Mark: func(string) {}},
	} {
		want, wantSeen := run(false, opt)
		got, gotSeen := run(true, opt)
		assert.Equal(t, want, got, "%+v", opt)
		assert.Equal(t, wantSeen, gotSeen, "%+v", opt)
		require.Positive(t, got.Ops)
		if opt.Mark != nil {
			assert.Len(t, gotSeen.marks, 3, "the trace's three marks")
		}
	}
}

// TestBrokenRuleInABatch: the ops before a broken rule, in the same batch,
// are replayed, and the error is the Validator's, naming the line.
func TestBrokenRuleInABatch(t *testing.T) {
	text := "a 0 1000\na 1 2000\nf 0\nf 0\na 2 4000\n"
	for _, batched := range []bool{true, false} {
		rd, err := trace.NewReader(strings.NewReader(text))
		require.NoError(t, err)
		var r trace.OpReader = rd
		if !batched {
			r = oneAtATime{rd}
		}
		a, dev := newAllocator(t, 0, allocator.Config{})
		_, err = Run(r, a, dev, Options{})
		var se *trace.StateError
		require.ErrorAs(t, err, &se)
		assert.EqualError(t, err, `memtrace line 4: "f 0": ID 0 is not live`)
		st := a.Stats()
		assert.Equal(t, int64(1024+2048), st.AllocatedBytes[stats.All].Peak, "a 0 and a 1 replayed")
		assert.Equal(t, int64(2048), st.AllocatedBytes[stats.All].Current, "f 0 replayed, a 2 not")
	}
}
