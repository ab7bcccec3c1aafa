package offline

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/internal/tracetest"
)

func parse(t testing.TB, text string) []trace.Op {
	t.Helper()
	ops, err := trace.ReadAll(strings.NewReader(text))
	require.NoError(t, err)
	return ops
}

// span is a block's lifetime and rounded size, for comparisons.
type span struct {
	start, end int
	bytes      uint64
}

func spans(blocks []Block) []span {
	var out []span
	for _, b := range blocks {
		out = append(out, span{b.Start, b.End, b.Bytes})
	}
	return out
}

func TestLifetimes(t *testing.T) {
	ops := parse(t, `m step0
t forward
a 1 100
a 2 513 1
a 3 0
f 1
r 2 2
r 2 2
r 2 0
r 2 1
f 2
s 2
a 4 1024 3
r 4 5
r 4 6
f 4
s 5
c
S
a 5 2048
f 3
a 6 1
`)
	blocks, err := Lifetimes(ops)
	require.NoError(t, err)
	assert.Equal(t, []span{
		{2, 5, 512},    // freed at its f
		{3, 11, 1024},  // recorded on stream 2: in use until s 2
		{4, 20, 0},     // size 0 takes no memory
		{12, 18, 1024}, // recorded on 5 and 6: until S, the first sync of both
		{19, 22, 2048},
		{21, 22, 512}, // never freed: lives to the end
	}, spans(blocks))
	peak, at := Bound(blocks)
	assert.Equal(t, uint64(2048+512), peak) // blocks 5 and 6 at op 21 (2048 + 512 > 512 + 1024)
	assert.Equal(t, 21, at)
}

func TestLifetimesRejectsBrokenTraces(t *testing.T) {
	for _, text := range []string{
		"a 1 10\na 1 10\n",
		"f 7\n",
		"a 1 10\nf 1\nf 1\n",
		"r 3 1\n",
		"a 1 18446744073709551615\n",
		"a 1 18446744073709551104\na 2 18446744073709551104\n",
	} {
		_, err := Lifetimes(parse(t, text))
		assert.Error(t, err, "%q", text)
		_, err = Pack(parse(t, text))
		assert.Error(t, err, "%q", text)
	}
	_, err := Lifetimes(parse(t, "a 1 10\nf 7\n"))
	assert.ErrorContains(t, err, "op 2 (f 7): block 7 is not live")
}

func TestPackSmall(t *testing.T) {
	// Two long-lived blocks of 1 KiB and a sequence of short ones that
	// fit in the hole the first leaves: greedy by size puts 2048 at the
	// bottom, the 1024s above, and reuses memory in time.
	ops := parse(t, `a 1 2048
a 2 1024
f 1
a 3 1024
a 4 1024
f 3
f 4
a 5 2048
`)
	p, err := Pack(ops)
	require.NoError(t, err)
	require.NoError(t, p.Check())
	assert.Equal(t, uint64(3072), p.Bound)
	assert.Equal(t, uint64(3072), p.Footprint)
	p, err = Pack(nil)
	require.NoError(t, err)
	assert.Zero(t, p.Footprint)
	require.NoError(t, p.Check())
}

func TestCheckFindsOverlap(t *testing.T) {
	blocks := []Block{
		{ID: 1, Bytes: 512, Start: 0, End: 4, Offset: 0},
		{ID: 2, Bytes: 1024, Start: 4, End: 6, Offset: 0},  // starts as 1 ends: fine
		{ID: 3, Bytes: 512, Start: 1, End: 5, Offset: 512}, // beside 1, under 2's top half
	}
	err := Check(blocks)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "blocks 3 (op 2, [512, 1024)) and 2 (op 5, [0, 1024))")
	blocks[2].Offset = 1024
	assert.NoError(t, Check(blocks))
	blocks[2].Offset = 511 // overlaps block 1 by one byte
	assert.Error(t, Check(blocks))
	blocks[2].Bytes = 0 // no memory, no overlap
	assert.NoError(t, Check(blocks))
	p := &Plan{Blocks: blocks, Ops: 6, Bound: 1024, Footprint: 1000}
	assert.ErrorContains(t, p.Check(), "the footprint is 1000 bytes, but the blocks reach 1024")
	p.Footprint = 1024
	assert.NoError(t, p.Check())
	p.Bound = 2048
	assert.ErrorContains(t, p.Check(), "the bound")
}

// naiveCheck is Check's definition: every pair of blocks.
func naiveCheck(blocks []Block) bool {
	for i := range blocks {
		for j := range i {
			if overlapsTime(&blocks[i], &blocks[j]) && overlapsAddress(&blocks[i], &blocks[j]) {
				return false
			}
		}
	}
	return true
}

// TestCheckAgreesWithPairs compares Check with the pairwise definition on
// random blocks at random offsets, many of which overlap.
func TestCheckAgreesWithPairs(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 12).Draw(t, "n")
		blocks := make([]Block, n)
		for i := range blocks {
			start := rapid.IntRange(0, 20).Draw(t, "start")
			blocks[i] = Block{
				ID:     uint64(i),
				Start:  start,
				End:    start + rapid.IntRange(1, 10).Draw(t, "len"),
				Bytes:  512 * rapid.Uint64Range(0, 4).Draw(t, "granules"),
				Offset: 512 * rapid.Uint64Range(0, 8).Draw(t, "offset"),
			}
		}
		want := naiveCheck(blocks)
		err := Check(blocks)
		if want != (err == nil) {
			t.Fatalf("Check says %v, the pairs say valid=%v", err, want)
		}
	})
}

// randomTrace draws a valid trace with every kind of op.
func randomTrace(t *rapid.T) []trace.Op {
	var ops []trace.Op
	var live []uint64
	next := uint64(0)
	n := rapid.IntRange(0, 200).Draw(t, "ops")
	for range n {
		switch k := rapid.IntRange(0, 9).Draw(t, "kind"); {
		case k <= 3 || len(live) == 0:
			size := rapid.SampledFrom([]uint64{0, 1, 512, 513, 4096, 100000, 1 << 20, 3 << 20}).Draw(t, "size")
			ops = append(ops, trace.Op{Kind: trace.Alloc, ID: next, Size: size, Stream: rapid.Uint64Range(0, 2).Draw(t, "stream")})
			live = append(live, next)
			next++
		case k <= 6:
			i := rapid.IntRange(0, len(live)-1).Draw(t, "free")
			ops = append(ops, trace.Op{Kind: trace.Free, ID: live[i]})
			live = append(live[:i], live[i+1:]...)
		case k == 7:
			i := rapid.IntRange(0, len(live)-1).Draw(t, "record")
			ops = append(ops, trace.Op{Kind: trace.RecordStream, ID: live[i], Stream: rapid.Uint64Range(0, 3).Draw(t, "on")})
		default:
			ops = append(ops, rapid.SampledFrom([]trace.Op{
				{Kind: trace.SyncStream, Stream: 1}, {Kind: trace.SyncStream, Stream: 2}, {Kind: trace.SyncStream, Stream: 3},
				{Kind: trace.SyncDevice}, {Kind: trace.EmptyCache}, {Kind: trace.Tag, Tag: "x"}, {Kind: trace.Mark, Name: "s"},
			}).Draw(t, "other"))
		}
	}
	return ops
}

// TestPackProperties packs random traces: the packing is valid (Check and
// the pairwise definition), the bound is the most bytes in use at any op,
// and the footprint is at least the bound and at most the sum of all
// blocks.
func TestPackProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		ops := randomTrace(t)
		p, err := Pack(ops)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Check(); err != nil {
			t.Fatal(err)
		}
		if !naiveCheck(p.Blocks) {
			t.Fatal("the pairs overlap")
		}
		var peak, sum uint64
		for op := range ops {
			var cur uint64
			for _, b := range p.Blocks {
				if b.Start <= op && op < b.End {
					cur += b.Bytes
				}
			}
			peak = max(peak, cur)
		}
		for _, b := range p.Blocks {
			sum += b.Bytes
			if b.Bytes%Granule != 0 || b.Bytes < b.Size || b.Bytes-b.Size >= Granule {
				t.Fatalf("block %d: %d bytes for %d", b.ID, b.Bytes, b.Size)
			}
		}
		if p.Bound != peak {
			t.Fatalf("bound %d, the ops hold %d at most", p.Bound, peak)
		}
		if p.Footprint < p.Bound || p.Footprint > sum {
			t.Fatalf("footprint %d, bound %d, sum %d", p.Footprint, p.Bound, sum)
		}
	})
}

// TestPackRealTraces packs the real traces held here and holds them to
// what greedy packing achieves on them: within 1% of the bound.
func TestPackRealTraces(t *testing.T) {
	for _, path := range []string{
		"../testdata/batches/bert_b2.trace.gz",
		"../../testdata/pub_cs336_MAGMA27_lm_fwdbwd.trace.gz",
		"../../replay/testdata/EoR_NN_cnn_counterfactuals.trace.gz",
	} {
		ops := tracetest.ReadFile(t, path)
		p, err := Pack(ops)
		require.NoError(t, err, path)
		require.NoError(t, p.Check(), path)
		assert.LessOrEqual(t, float64(p.Footprint), 1.01*float64(p.Bound), path)
		t.Logf("%s: bound %d, footprint %d (%.4f), order %s", path, p.Bound, p.Footprint, float64(p.Footprint)/float64(p.Bound), p.Order)
	}
}

// TestPackFirstFitMeetsTheBound holds Pack to what its passes by first
// fit achieve where best fit did not: random_mixed_2000 within 4 KiB of
// its bound (by best fit, 1.004 times it: 48 MB more), eor_cnn at its
// bound (by best fit, 1 KiB more).
func TestPackFirstFitMeetsTheBound(t *testing.T) {
	for _, c := range []struct {
		path  string
		slack uint64
	}{
		{"../../replay/testdata/random_mixed_2000.trace.gz", 4096},
		{"../../replay/testdata/EoR_NN_cnn_counterfactuals.trace.gz", 0},
	} {
		p, err := Pack(tracetest.ReadFile(t, c.path))
		require.NoError(t, err, c.path)
		require.NoError(t, p.Check(), c.path)
		assert.LessOrEqual(t, p.Footprint, p.Bound+c.slack, c.path)
	}
}

// TestPackLargeTrace packs random_mixed, 101,016 allocations, and checks
// the packing. Its time is logged, not asserted (BenchmarkPack measures).
func TestPackLargeTrace(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("packs 10^5 allocations")
	}
	ops := tracetest.ReadFile(t, "../../replay/testdata/pytorch/random_mixed.trace.gz")
	start := time.Now()
	p, err := Pack(ops)
	require.NoError(t, err)
	elapsed := time.Since(start)
	require.NoError(t, p.Check())
	assert.GreaterOrEqual(t, p.Footprint, p.Bound)
	t.Logf("random_mixed: %d blocks, bound %d, footprint %d (%.4f), order %s, %v", len(p.Blocks), p.Bound, p.Footprint,
		float64(p.Footprint)/float64(p.Bound), p.Order, elapsed)
}

// BenchmarkPack packs every trace held here and reports, beside the time,
// the bound, the packing's footprint and their ratio:
//
//	go test ./trace/plan/offline -run XXX -bench Pack -benchtime 3x
func BenchmarkPack(b *testing.B) {
	for _, path := range []string{
		"../testdata/batches/bert_b2.trace.gz",
		"../testdata/batches/bert_b4.trace.gz",
		"../testdata/batches/bert_b8.trace.gz",
		"../../testdata/pub_cs336_MAGMA27_lm_fwdbwd.trace.gz",
		"../../replay/testdata/EoR_NN_cnn_counterfactuals.trace.gz",
		"../../replay/testdata/random_mixed_2000.trace.gz",
		"../../replay/testdata/pytorch/random_mixed.trace.gz",
	} {
		ops := tracetest.ReadFile(b, path)
		name := strings.TrimSuffix(path[strings.LastIndex(path, "/")+1:], ".trace.gz")
		b.Run(name, func(b *testing.B) {
			var p *Plan
			for b.Loop() {
				var err error
				if p, err = Pack(ops); err != nil {
					b.Fatal(err)
				}
			}
			if err := p.Check(); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(len(p.Blocks)), "allocs")
			b.ReportMetric(float64(p.Bound), "bound_bytes")
			b.ReportMetric(float64(p.Footprint), "planned_bytes")
			b.ReportMetric(float64(p.Footprint)/float64(max(p.Bound, 1)), "planned/bound")
		})
	}
}
