package plan

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/internal/ctxtest"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/internal/tracetest"
)

// linearProgram is a random program whose allocation sizes are p + q ×
// batch with known p and q: a few streams, record-streams, syncs, tags and
// marks.
type linearProgram struct {
	ops  []trace.Op // sizes unset
	p, q []uint64   // by op index
}

func newLinearProgram(seed uint64, n int) *linearProgram {
	rng := rand.New(rand.NewPCG(seed, 1))
	lp := &linearProgram{}
	var live []uint64
	id := uint64(0)
	push := func(op trace.Op, p, q uint64) {
		lp.ops = append(lp.ops, op)
		lp.p = append(lp.p, p)
		lp.q = append(lp.q, q)
	}
	for i := 0; i < n; i++ {
		switch k := rng.IntN(20); {
		case k < 9 || len(live) == 0:
			id++
			p := uint64(rng.IntN(4 << 20))
			q := uint64(0)
			if rng.IntN(3) > 0 {
				q = uint64(rng.IntN(1<<20)) + 1
			}
			push(trace.Op{Kind: trace.Alloc, ID: id, Stream: uint64(rng.IntN(3))}, p, q)
			live = append(live, id)
		case k < 17:
			j := rng.IntN(len(live))
			push(trace.Op{Kind: trace.Free, ID: live[j]}, 0, 0)
			live = append(live[:j], live[j+1:]...)
		case k == 17:
			push(trace.Op{Kind: trace.RecordStream, ID: live[rng.IntN(len(live))], Stream: 1 + uint64(rng.IntN(2))}, 0, 0)
		case k == 18:
			push(trace.Op{Kind: trace.SyncDevice}, 0, 0)
		default:
			push(trace.Op{Kind: trace.Mark, Name: fmt.Sprintf("step%d", i)}, 0, 0)
		}
	}
	for _, l := range live {
		push(trace.Op{Kind: trace.Free, ID: l}, 0, 0)
	}
	return lp
}

// at returns the program at batch b, with IDs renumbered by shift (IDs
// need not agree between probes).
func (lp *linearProgram) at(b, shift uint64) []trace.Op {
	ops := make([]trace.Op, len(lp.ops))
	for i, op := range lp.ops {
		if op.Kind == trace.Alloc {
			op.Size = lp.p[i] + lp.q[i]*b
		}
		if op.Kind == trace.Alloc || op.Kind == trace.Free || op.Kind == trace.RecordStream {
			op.ID += shift
		}
		ops[i] = op
	}
	return ops
}

func TestModelLinear(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		lp := newLinearProgram(seed, 600)
		probes := []Probe{{"b3", 3, lp.at(3, 0)}, {"b1", 1, lp.at(1, 1000)}}
		if seed%2 == 0 {
			probes = append(probes, Probe{"b7", 7, lp.at(7, 5000)}) // a third probe checks the model
		}
		m, err := NewModel(probes...)
		require.NoError(t, err, "seed %d", seed)
		assert.Equal(t, len(lp.ops), m.Len())
		for _, b := range []uint64{1, 2, 5, 16, 100} {
			ops, err := m.Ops(b)
			require.NoError(t, err)
			want := lp.at(b, 0)
			assert.Equal(t, want, ops, "seed %d batch %d: the synthesized trace is the program at that batch", seed, b)
			peak, err := m.PeakRequested(b)
			require.NoError(t, err)
			assert.Equal(t, PeakRequested(want), peak)
			got, err := m.Predict(b, allocator.Config{}, 0)
			require.NoError(t, err)
			direct, err := Replay(want, allocator.Config{}, 0)
			require.NoError(t, err)
			assert.Equal(t, direct.PeakAllocated, got.PeakAllocated)
			assert.Equal(t, direct.PeakReserved, got.PeakReserved)
		}
	}
}

func TestModelBatchesRealTrace(t *testing.T) {
	b2 := tracetest.ReadFile(t, "testdata/batches/bert_b2.trace.gz")
	b4 := tracetest.ReadFile(t, "testdata/batches/bert_b4.trace.gz")
	b8 := tracetest.ReadFile(t, "testdata/batches/bert_b8.trace.gz")
	m, err := NewModel(Probe{"bert_b2", 2, b2}, Probe{"bert_b4", 4, b4})
	require.NoError(t, err)
	assert.Positive(t, m.Varying())
	ops, err := m.Ops(8)
	require.NoError(t, err)
	assert.Equal(t, b8, ops, "batch 8 from the batch 2 and 4 probes is the real batch-8 trace")

	for _, conf := range []string{"", "expandable_segments:True"} {
		cfg, err := allocator.ParseConf(conf)
		require.NoError(t, err)
		pred, err := m.Predict(8, cfg, 0)
		require.NoError(t, err)
		real, err := Replay(b8, cfg, 0)
		require.NoError(t, err)
		assert.Equal(t, real.PeakAllocated, pred.PeakAllocated, conf)
		assert.Equal(t, real.PeakReserved, pred.PeakReserved, conf)
		assert.Equal(t, real.Stats, pred.Stats, conf)
	}

	// All three agree with the model.
	_, err = NewModel(Probe{"bert_b8", 8, b8}, Probe{"bert_b2", 2, b2}, Probe{"bert_b4", 4, b4})
	require.NoError(t, err)
}

func TestModelMaxBatch(t *testing.T) {
	b2 := tracetest.ReadFile(t, "testdata/batches/bert_b2.trace.gz")
	b4 := tracetest.ReadFile(t, "testdata/batches/bert_b4.trace.gz")
	m, err := NewModel(Probe{"bert_b2", 2, b2}, Probe{"bert_b4", 4, b4})
	require.NoError(t, err)
	const capacity = 4 << 30
	r, err := m.MaxBatch(allocator.Config{}, capacity)
	require.NoError(t, err)
	require.Positive(t, r.MaxBatch)
	assert.False(t, r.Unbounded)
	at, err := m.Predict(r.MaxBatch, allocator.Config{}, capacity)
	require.NoError(t, err)
	assert.Zero(t, at.OOMs, "the answer fits")
	next, err := m.Predict(r.MaxBatch+1, allocator.Config{}, capacity)
	require.NoError(t, err)
	assert.Positive(t, next.OOMs, "the next batch does not")
	assert.Less(t, len(r.Trials), 40)

	// Too small a device for batch 1.
	r, err = m.MaxBatch(allocator.Config{}, 1<<30)
	require.NoError(t, err)
	assert.Zero(t, r.MaxBatch)

	// A program whose sizes do not depend on the batch fits at any batch.
	flat := parse(t, "a 1 1048576\na 2 4096\nf 1\nf 2\n")
	m, err = NewModel(Probe{"x", 1, flat}, Probe{"y", 2, flat})
	require.NoError(t, err)
	r, err = m.MaxBatch(allocator.Config{}, 0)
	require.NoError(t, err)
	assert.True(t, r.Unbounded)
	assert.EqualValues(t, MaxBatch, r.MaxBatch)
}

func TestModelErrors(t *testing.T) {
	lp := newLinearProgram(7, 200)
	b1, b2 := lp.at(1, 0), lp.at(2, 0)
	firstAlloc := func(ops []trace.Op, from int) int {
		for i := from; i < len(ops); i++ {
			if ops[i].Kind == trace.Alloc && lp.q[i] != 0 {
				return i
			}
		}
		t.Fatal("no allocation")
		return 0
	}
	alignErr := func(t *testing.T, err error, op int, want string) {
		t.Helper()
		var ae *AlignError
		require.ErrorAs(t, err, &ae)
		assert.Equal(t, op, ae.Op)
		assert.Contains(t, err.Error(), want)
		assert.NotContains(t, err.Error(), "\n")
	}

	_, err := NewModel(Probe{"a", 1, b1})
	assert.ErrorContains(t, err, "at least two probes")
	_, err = NewModel(Probe{"a", 1, b1}, Probe{"b", 1, b1})
	assert.ErrorContains(t, err, "same batch 1")
	_, err = NewModel(Probe{"a", 0, b1}, Probe{"b", 1, b1})
	assert.ErrorContains(t, err, "batch 0 is not between")

	// One op fewer.
	_, err = NewModel(Probe{"a", 1, b1}, Probe{"b", 2, b2[:len(b2)-1]})
	alignErr(t, err, len(b1), fmt.Sprintf("a has %d ops, b has %d", len(b1), len(b1)-1))

	// A different kind of op.
	bad := append([]trace.Op(nil), b2...)
	bad[10] = trace.Op{Kind: trace.SyncDevice}
	if b1[10].Kind == trace.SyncDevice {
		bad[10] = trace.Op{Kind: trace.EmptyCache}
	}
	_, err = NewModel(Probe{"a", 1, b1}, Probe{"b", 2, bad})
	alignErr(t, err, 11, "a has")

	// A different stream.
	i := firstAlloc(b1, 0)
	bad = append([]trace.Op(nil), b2...)
	bad[i].Stream += 7
	_, err = NewModel(Probe{"a", 1, b1}, Probe{"b", 2, bad})
	alignErr(t, err, i+1, "b has")

	// A slope that is not a whole number of bytes.
	b3 := lp.at(3, 0)
	bad = append([]trace.Op(nil), b3...)
	bad[i].Size++
	_, err = NewModel(Probe{"a", 1, b1}, Probe{"c", 3, bad})
	alignErr(t, err, i+1, "whole bytes")

	// A third probe that does not fit the line of the first two.
	j := firstAlloc(b1, i+1)
	bad = append([]trace.Op(nil), b3...)
	bad[j].Size += 2
	_, err = NewModel(Probe{"a", 1, b1}, Probe{"b", 2, b2}, Probe{"c", 3, bad})
	alignErr(t, err, j+1, fmt.Sprintf("size %d at batch 3 does not fit", bad[j].Size))

	// A free of a block allocated by a different op.
	ops1 := parse(t, "a 1 100\na 2 200\nf 1\nf 2\n")
	ops2 := parse(t, "a 1 100\na 2 200\nf 2\nf 1\n")
	_, err = NewModel(Probe{"a", 1, ops1}, Probe{"b", 2, ops2})
	alignErr(t, err, 3, `a has "f 1", b has "f 2"`)
	// The same ops with other IDs align.
	ops3 := parse(t, "a 7 100\na 9 200\nf 7\nf 9\n")
	_, err = NewModel(Probe{"a", 1, ops1}, Probe{"b", 2, ops3})
	require.NoError(t, err)

	// Sizes that shrink below zero at large batches.
	down := parse(t, "a 1 1000\nf 1\n")
	down2 := parse(t, "a 1 900\nf 1\n")
	m, err := NewModel(Probe{"a", 1, down}, Probe{"b", 2, down2})
	require.NoError(t, err)
	lo, hi := m.Range()
	assert.EqualValues(t, 1, lo)
	assert.EqualValues(t, 11, hi)
	_, err = m.Ops(12)
	alignErr(t, err, 1, "out of range at batch 12")

	// A long op is quoted in part.
	long := parse(t, "t "+strings.Repeat("x", 300)+"\n")
	other := parse(t, "t y\n")
	_, err = NewModel(Probe{"a", 1, long}, Probe{"b", 2, other})
	require.Error(t, err)
	assert.Less(t, len(err.Error()), 300)
}

// FuzzNewModel: any two traces and batches give a model or an error,
// never a panic, and a model synthesizes what it claims.
func FuzzNewModel(f *testing.F) {
	f.Add("a 1 100\nf 1\n", "a 1 300\nf 1\n", uint64(1), uint64(3), uint64(5))
	f.Add("a 1 100\na 2 7\nr 1 2\nf 2\nf 1\n", "a 5 0\na 6 7\nr 5 2\nf 6\nf 5\n", uint64(2), uint64(1), uint64(1<<40))
	f.Add("a 1 9223372036854775807\n", "a 1 0\n", uint64(1), uint64(2), uint64(3))
	f.Fuzz(func(t *testing.T, x, y string, bx, by, n uint64) {
		ox, err := trace.ReadAll(strings.NewReader(x))
		if err != nil {
			return
		}
		oy, err := trace.ReadAll(strings.NewReader(y))
		if err != nil {
			return
		}
		m, err := NewModel(Probe{"x", bx, ox}, Probe{"y", by, oy})
		if err != nil {
			return
		}
		ops, err := m.Ops(n)
		if err != nil {
			return
		}
		peak, err := m.PeakRequested(n)
		if err != nil {
			t.Fatalf("Ops(%d) worked, PeakRequested did not: %v", n, err)
		}
		if peak != PeakRequested(ops) {
			t.Fatalf("PeakRequested(%d) = %d, of the ops %d", n, peak, PeakRequested(ops))
		}
	})
}

// A prediction and a search stop by their context, and give the plain
// calls' answers without one.
func TestScaleContextStops(t *testing.T) {
	b2 := tracetest.ReadFile(t, "testdata/batches/bert_b2.trace.gz")
	b4 := tracetest.ReadFile(t, "testdata/batches/bert_b4.trace.gz")
	m, err := NewModel(Probe{"bert_b2", 2, b2}, Probe{"bert_b4", 4, b4})
	require.NoError(t, err)
	_, err = m.PredictContext(ctxtest.NewCountdown(2), 16, allocator.Config{}, 0)
	require.ErrorIs(t, err, context.Canceled)
	_, err = m.MaxBatchContext(ctxtest.NewCountdown(5), allocator.Config{}, 4<<30)
	require.ErrorIs(t, err, context.Canceled)
	// Without a done context the answers are those of the plain calls.
	a, err := m.MaxBatchContext(context.Background(), allocator.Config{}, 4<<30)
	require.NoError(t, err)
	b, err := m.MaxBatch(allocator.Config{}, 4<<30)
	require.NoError(t, err)
	assert.Equal(t, b.MaxBatch, a.MaxBatch)
}
