package replay

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/trace"
)

// plantedLeak is a training loop in memtrace: weights loaded once, Adam
// moments made in the first optimizer step, activations freed every step,
// and one 4 KiB block per step kept forever (the leak).
const plantedLeak = `# memtrace v1
t load
a 1 8388608
a 2 8388608
m step1
t forward
a 10 6291456
a 11 6291456
a 100 4096
t backward
f 10
f 11
t optimizer
a 20 8388608
a 21 8388608
m step2
t forward
a 10 6291456
a 11 6291456
a 101 4096
t backward
f 10
f 11
t optimizer
m step3
t forward
a 10 6291456
a 11 6291456
a 102 4096
t backward
f 10
f 11
t optimizer
m step4
`

func runText(t *testing.T, text string, cfg allocator.Config, capacity uint64, opt Options) (*Result, *allocator.Allocator) {
	t.Helper()
	a, dev := newAllocator(t, capacity, cfg)
	r, err := trace.NewReader(strings.NewReader(text))
	require.NoError(t, err)
	res, err := Run(r, a, dev, opt)
	require.NoError(t, err)
	return res, a
}

func TestReplayFindsThePlantedLeak(t *testing.T) {
	res, _ := runText(t, plantedLeak, allocator.Config{}, 80<<30, Options{Phases: true, Leaks: true})
	assert.Equal(t, []LeakResult{{Phase: "forward", Size: 4096, Count: 3, Grew: 3}}, res.Leaks, "the leak and only it")
	assert.Equal(t, map[string]PhaseResult{
		"load":      {PeakAllocated: 16 << 20, Allocs: 2},
		"forward":   {PeakAllocated: 12<<20 + 3*4096, Allocs: 9},
		"optimizer": {PeakAllocated: 16 << 20, Allocs: 2},
	}, res.Phases)
}

func TestReplayWithoutOptionsLeavesPhasesOut(t *testing.T) {
	res, _ := runText(t, plantedLeak, allocator.Config{}, 80<<30, Options{})
	assert.Nil(t, res.Phases)
	assert.Nil(t, res.Leaks)
}

func TestReplayOOMNamesItsPhase(t *testing.T) {
	text := "t forward\na 1 104857600\nt backward\na 2 104857600\n"
	res, a := runText(t, text, allocator.Config{}, 150<<20, Options{})
	assert.EqualValues(t, 1, res.OOMs)
	var got error
	a.OnOutOfMemory(func(e *allocator.OutOfMemoryError) { got = e })
	_, _ = a.Alloc(200<<20, 0)
	require.Error(t, got)
	assert.Contains(t, got.Error(), `failed in phase "backward"`)
}

// TestRealTrainingLoopHasNoLeak: BERT-base training at batch 2, three steps
// marked: parameters, gradients and Adam state are made once or freed
// every step, so nothing grows at every boundary.
func TestRealTrainingLoopHasNoLeak(t *testing.T) {
	a, dev := newAllocator(t, 80<<30, allocator.Config{})
	r, err := trace.Open("testdata/bert_b2.trace.gz")
	require.NoError(t, err)
	defer r.Close()
	res, err := Run(r, a, dev, Options{Leaks: true})
	require.NoError(t, err)
	assert.Empty(t, res.Leaks)
	assert.NotNil(t, res.Leaks, "an empty list, not null, in JSON")
}
