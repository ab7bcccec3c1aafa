package plan

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/internal/ctxtest"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/internal/tracetest"
	"github.com/gpumem/gpumem/trace/replay"
)

const (
	smallTrace = "../replay/testdata/random_mixed_2000.trace.gz"
	mib        = 1 << 20
)

func parse(t testing.TB, text string) []trace.Op {
	t.Helper()
	ops, err := trace.ReadAll(strings.NewReader(text))
	require.NoError(t, err)
	return ops
}

// verifyFit replays at the answer and one step below, independently of
// Fit.
func verifyFit(t *testing.T, ops []trace.Op, cfg allocator.Config, r *FitResult) {
	t.Helper()
	at, err := Replay(ops, cfg, r.MinCapacity)
	require.NoError(t, err)
	assert.Zero(t, at.OOMs, "no out of memory at the answer")
	assert.Equal(t, at.PeakReserved, r.AtMin.PeakReserved)
	below, err := Replay(ops, cfg, r.MinCapacity-Step)
	require.NoError(t, err)
	assert.Positive(t, below.OOMs, "out of memory 2 MiB below the answer")
	assert.Equal(t, below.OOMs, r.BelowOOMs)
	assert.Zero(t, r.MinCapacity%Step)
	assert.GreaterOrEqual(t, r.MinCapacity, r.PeakRequested)
	assert.InDelta(t, float64(r.MinCapacity)/float64(r.PeakRequested), r.FitRatio, 1e-12)
}

func TestFitVerified(t *testing.T) {
	for _, path := range []string{smallTrace, "testdata/batches/bert_b2.trace.gz"} {
		ops := tracetest.ReadFile(t, path)
		for _, conf := range []string{"", "expandable_segments:True", "max_split_size_mb:128"} {
			cfg, err := allocator.ParseConf(conf)
			require.NoError(t, err)
			r, err := Fit(ops, FitOptions{Config: cfg})
			require.NoError(t, err, "%s %q", path, conf)
			verifyFit(t, ops, cfg, r)
			assert.Empty(t, r.NonMonotone, "%s %q", path, conf)
			assert.Equal(t, r.MinCapacity, r.SafeCapacity)
			assert.Equal(t, PeakRequested(ops), r.PeakRequested)
			assert.EqualValues(t, r.PeakRequested, r.AtMin.PeakRequested, "the replay at the answer holds every block")
			// Every capacity tried agrees with the answer.
			for _, tr := range r.Trials {
				assert.Equal(t, tr.Capacity < r.MinCapacity, tr.OOMs > 0, "%s %q: %+v", path, conf, tr)
			}
		}
	}
}

func TestFitBelowUnconstrainedPeak(t *testing.T) {
	// Under pressure the allocator releases its cache and retries, so a
	// trace can run on less than the peak it reserves on a big device.
	ops := tracetest.ReadFile(t, smallTrace)
	free, err := Replay(ops, allocator.Config{}, 0)
	require.NoError(t, err)
	r, err := Fit(ops, FitOptions{})
	require.NoError(t, err)
	assert.Less(t, r.MinCapacity, uint64(free.PeakReserved))
	assert.Positive(t, r.AtMin.Stats["num_alloc_retries"])
}

// nonMonotone runs on 62 to 68 MiB, fails on 70 MiB, and runs from 72 MiB
// up with PyTorch's default configuration. Below 70 MiB the 40 MiB request
// finds the device full, the allocator releases the cached 30 MiB segment,
// and the 3 MiB request gets a 20 MiB segment of its own. On 70 MiB the
// 40 MiB request fits beside the cached segment, the 3 MiB request splits
// that segment, and the 1 MiB request then finds the device full with no
// whole segment to release. From 72 MiB there is room for it.
const nonMonotone = `a 1 31457280
f 1
a 2 41943040
a 3 3145728
a 4 1048576
f 3
f 2
a 5 1048576
a 6 46137344
f 6
a 7 32505856
`

func TestFitNonMonotone(t *testing.T) {
	ops := parse(t, nonMonotone)
	for c := uint64(46 * mib); c <= 80*mib; c += Step {
		o, err := Replay(ops, allocator.Config{}, c)
		require.NoError(t, err)
		want := c < 62*mib || c == 70*mib
		require.Equal(t, want, o.OOMs > 0, "%d MiB", c/mib)
	}
	r, err := Fit(ops, FitOptions{})
	require.NoError(t, err)
	verifyFit(t, ops, allocator.Config{}, r)
	assert.EqualValues(t, 62*mib, r.MinCapacity)
	assert.Equal(t, []uint64{70 * mib}, r.NonMonotone)
	assert.EqualValues(t, 72*mib, r.SafeCapacity)
	// With no checks the bisection alone lands on the safe side of the
	// failure, and nothing says why.
	r, err = Fit(ops, FitOptions{Checks: -1})
	require.NoError(t, err)
	assert.EqualValues(t, 72*mib, r.MinCapacity)
	assert.Empty(t, r.NonMonotone)
}

// fake returns a replay function that fails where fails says.
func fake(fails func(c uint64) bool, calls *int) func(uint64) (*Outcome, error) {
	return func(c uint64) (*Outcome, error) {
		*calls++
		o := &Outcome{}
		if fails(c) {
			o.OOMs = 1
			o.FirstOOM = &allocator.OutOfMemoryError{Requested: c}
		}
		return o, nil
	}
}

func TestFitSearch(t *testing.T) {
	var calls int
	// Monotone: runs from 1000 MiB.
	r, err := fitSearch(900*mib, MaxCapacity, 0, fake(func(c uint64) bool { return c < 1000*mib }, &calls))
	require.NoError(t, err)
	assert.EqualValues(t, 1000*mib, r.MinCapacity)
	assert.EqualValues(t, 1000*mib, r.SafeCapacity)
	assert.Empty(t, r.NonMonotone)
	assert.Equal(t, 1, int(r.BelowOOMs))
	assert.Len(t, r.Trials, calls, "each capacity is replayed once")
	assert.Less(t, calls, 30)

	// An island of failure above the answer, out of the bisection's way.
	calls = 0
	r, err = fitSearch(900*mib, MaxCapacity, 0, fake(func(c uint64) bool { return c < 1000*mib || c == 1008*mib }, &calls))
	require.NoError(t, err)
	assert.EqualValues(t, 1000*mib, r.MinCapacity)
	assert.Equal(t, []uint64{1008 * mib}, r.NonMonotone)
	assert.EqualValues(t, 1010*mib, r.SafeCapacity)

	// An island of success below the answer.
	r, err = fitSearch(900*mib, MaxCapacity, 0, fake(func(c uint64) bool { return c < 1000*mib || (c >= 1020*mib && c < 1100*mib) }, &calls))
	require.NoError(t, err)
	assert.EqualValues(t, 1000*mib, r.MinCapacity)
	assert.EqualValues(t, 1100*mib, r.SafeCapacity)
	assert.NotEmpty(t, r.NonMonotone)

	// Nothing requested: the smallest device.
	r, err = fitSearch(0, MaxCapacity, 0, fake(func(uint64) bool { return false }, &calls))
	require.NoError(t, err)
	assert.EqualValues(t, Step, r.MinCapacity)
	assert.Zero(t, r.FitRatio)

	// Never runs.
	_, err = fitSearch(10*mib, 1024*mib, 0, fake(func(uint64) bool { return true }, &calls))
	assert.ErrorContains(t, err, "runs out of memory on every capacity tried, up to 1024.00 MiB")
	var oom *allocator.OutOfMemoryError
	assert.ErrorAs(t, err, &oom, "the last out-of-memory error is kept")

	// More than the biggest device.
	_, err = fitSearch(2048*mib, 1024*mib, 0, fake(func(uint64) bool { return false }, &calls))
	assert.ErrorContains(t, err, "more than the largest simulated device")

	// A failure on every capacity above the answer that the checks try.
	_, err = fitSearch(900*mib, MaxCapacity, 0, fake(func(c uint64) bool { return c != 1350*mib }, &calls))
	assert.ErrorContains(t, err, "non-monotone")
}

func TestFitReplayError(t *testing.T) {
	ops := parse(t, "a 1 1024\nf 1\n")
	ops = append(ops, trace.Op{Kind: trace.Free, ID: 1}) // a double free
	_, err := Fit(ops, FitOptions{})
	require.Error(t, err)
	assert.ErrorContains(t, err, "not live")
	assert.False(t, errors.Is(err, device.ErrOutOfMemory))
}

func TestReplayFirstOOM(t *testing.T) {
	ops := parse(t, "a 1 1048576\na 2 104857600\na 3 104857600\nf 1\n")
	o, err := Replay(ops, allocator.Config{}, 64*mib)
	require.NoError(t, err)
	assert.EqualValues(t, 2, o.OOMs)
	assert.EqualValues(t, 2, o.FirstOOMAlloc, "the second allocation fails first")
	var oom *allocator.OutOfMemoryError
	require.ErrorAs(t, o.FirstOOM, &oom)
	assert.EqualValues(t, 104857600, oom.Requested)

	m, err := NewMachine(allocator.Config{}, 64*mib, true)
	require.NoError(t, err)
	assert.Nil(t, m.Allocator, "the baseline has no caching allocator")
	o, err = m.Run(trace.SliceReader(ops), replay.Options{})
	require.NoError(t, err)
	assert.EqualValues(t, 2, o.OOMs)
	assert.ErrorIs(t, o.FirstOOM, device.ErrOutOfMemory)
	assert.Positive(t, o.DeviceSeconds)
	_, err = m.Run(trace.SliceReader(ops), replay.Options{})
	assert.ErrorContains(t, err, "one replay")

	// The caller's own Options.OOM sees every failed allocation, the
	// Machine's first one kept as well.
	m, err = NewMachine(allocator.Config{}, 64*mib, false)
	require.NoError(t, err)
	var seen []int64
	o, err = m.Run(trace.SliceReader(ops), replay.Options{OOM: func(err error, alloc int64) {
		assert.ErrorIs(t, err, device.ErrOutOfMemory)
		seen = append(seen, alloc)
	}})
	require.NoError(t, err)
	assert.Equal(t, []int64{2, 3}, seen)
	assert.EqualValues(t, 2, o.FirstOOMAlloc)
}

func TestPeakRequested(t *testing.T) {
	assert.EqualValues(t, 3000, PeakRequested(parse(t, "a 1 1000\na 2 2000\nf 1\na 3 500\nf 2\nf 3\n")))
	assert.Zero(t, PeakRequested(nil))
	huge := []trace.Op{{Kind: trace.Alloc, ID: 1, Size: 1 << 63}, {Kind: trace.Alloc, ID: 2, Size: 1 << 63}}
	assert.EqualValues(t, uint64(1<<64-1), PeakRequested(huge))
}

// A Fit stops at the first check of its context after the context is
// done, and returns no result.
func TestFitContextStops(t *testing.T) {
	ops := tracetest.ReadFile(t, "testdata/batches/bert_b2.trace.gz")
	want, err := Fit(ops, FitOptions{})
	require.NoError(t, err)
	require.Greater(t, len(want.Trials), 3)
	for _, n := range []int64{0, 1, 5, 20} {
		ctx := ctxtest.NewCountdown(n)
		r, err := FitContext(ctx, ops, FitOptions{})
		assert.Nil(t, r, "n=%d", n)
		require.ErrorIs(t, err, context.Canceled, "n=%d", n)
		assert.Equal(t, int64(-1), ctx.Left(), "n=%d: the search stops at the first check that sees the context done", n)
	}
}
