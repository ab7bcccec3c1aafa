package allocator

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/internal/simtest"
	"github.com/gpumem/gpumem/stats"
)

// phaseModel follows what PhaseStats must say, from the allocated bytes
// of each block (read from the stats around its Alloc).
type phaseModel struct {
	cur, peak, allocs map[string]int64
	blocks            map[string]int64
	peakBlocks        map[string]int64
}

func newPhaseModel() *phaseModel {
	return &phaseModel{cur: map[string]int64{}, peak: map[string]int64{}, allocs: map[string]int64{}, blocks: map[string]int64{}, peakBlocks: map[string]int64{}}
}

func (m *phaseModel) add(ph string, n int64) {
	m.cur[ph] += n
	m.blocks[ph]++
	m.allocs[ph]++
	m.peak[ph] = max(m.peak[ph], m.cur[ph])
	m.peakBlocks[ph] = max(m.peakBlocks[ph], m.blocks[ph])
}

func (m *phaseModel) sub(ph string, n int64) {
	m.cur[ph] -= n
	m.blocks[ph]--
}

func (m *phaseModel) resetPeaks() {
	for ph := range m.cur {
		m.peak[ph], m.peakBlocks[ph] = m.cur[ph], m.blocks[ph]
	}
}

// TestPhasePeaksAcrossStreams: one goroutine allocates and frees on four
// streams (each a shard, so that the phase counts of its blocks are kept
// per shard and their peaks through limits and cuts) while the phase
// changes, the first phase named mid-way; every phase's current, peak and
// allocations equal the model's after every step, through peak resets.
func TestPhasePeaksAcrossStreams(t *testing.T) {
	a, dev := newTest(t, 0, Config{})
	streams := simtest.Streams(t, dev, 3)
	rng := rand.New(rand.NewPCG(7, 11))
	m := newPhaseModel()
	type live struct {
		ph string
		n  int64
	}
	blocks := map[device.Ptr]live{}
	var ptrs []device.Ptr
	phase := ""
	names := []string{"forward", "backward", "optimizer", ""}
	steps := 3000
	if selfCheck {
		steps = 300
	}
	for i := range steps {
		switch {
		case i == steps/6 || i > steps/6 && rng.IntN(100) == 0:
			phase = names[rng.IntN(len(names))]
			a.SetPhase(phase)
		case i%997 == 0:
			a.ResetPeakStats()
			m.resetPeaks()
		case len(ptrs) > 0 && rng.IntN(2) == 0:
			j := rng.IntN(len(ptrs))
			p := ptrs[j]
			ptrs[j] = ptrs[len(ptrs)-1]
			ptrs = ptrs[:len(ptrs)-1]
			mustFree(t, a, p)
			m.sub(blocks[p].ph, blocks[p].n)
			delete(blocks, p)
		default:
			size := uint64(512 + rng.IntN(3*mib))
			before := get(t, a, "allocated_bytes.all.current")
			p := mustAlloc(t, a, size, streams[rng.IntN(len(streams))])
			n := get(t, a, "allocated_bytes.all.current") - before
			blocks[p] = live{phase, n}
			ptrs = append(ptrs, p)
			m.add(phase, n)
		}
		if i%50 != 0 && i != steps-1 {
			continue
		}
		got := map[string]stats.PhaseStats{}
		for _, ps := range a.PhaseStats() {
			got[ps.Name] = ps
		}
		for ph, n := range m.allocs {
			g := got[ph]
			require.Equal(t, m.cur[ph], g.AllocatedBytes.Current, "step %d, phase %q: current bytes", i, ph)
			require.Equal(t, m.peak[ph], g.AllocatedBytes.Peak, "step %d, phase %q: peak bytes", i, ph)
			require.Equal(t, m.blocks[ph], g.Allocations.Current, "step %d, phase %q: blocks", i, ph)
			require.Equal(t, m.peakBlocks[ph], g.Allocations.Peak, "step %d, phase %q: peak blocks", i, ph)
			require.Equal(t, n, g.Allocations.Allocated, "step %d, phase %q: allocations", i, ph)
		}
		require.NoError(t, a.CheckInvariants())
	}
	assert.True(t, a.phased)
	assert.Len(t, a.shards, 4)
}

// TestPhaseCutsOfTwoWaitingOperations: an Alloc and a Free of one phase
// on two streams pass limits at once and wait for one cut (the Alloc a
// limit of the phase, the Free one of inactive_split); the cut counts them
// one after the other, in the order of the streams, from the state
// before both: the phase's peak is that of the Alloc first, above the
// total after both.
func TestPhaseCutsOfTwoWaitingOperations(t *testing.T) {
	a, bx := twoWaitingOperations(t, "forward")
	const x, q = waitX, waitQ
	fwd := func() stats.PhaseStats {
		for _, ps := range a.PhaseStats() {
			if ps.Name == "forward" {
				return ps
			}
		}
		return stats.PhaseStats{}
	}
	before := fwd()

	allocAndFreeIntoOneCut(t, a, q, bx, func(sh *shard) bool { return sh.cut && sh.cutOp.phased })
	after := fwd()
	assert.Equal(t, before.AllocatedBytes.Current+q, after.AllocatedBytes.Peak, "the Alloc first")
	assert.Equal(t, before.Allocations.Current+1, after.Allocations.Peak)
	assert.Equal(t, before.AllocatedBytes.Current+q-x, after.AllocatedBytes.Current)
	require.NoError(t, a.CheckInvariants())
}

// TestFirstPhaseFollowsTheStats: until a second phase is named, nothing
// is counted by phase and the first phase's stats are allocation's and
// allocated_bytes' (all pools), resets included; naming a second phase
// carries them over.
func TestFirstPhaseFollowsTheStats(t *testing.T) {
	a, _ := newTest(t, 0, Config{})
	p := mustAlloc(t, a, 3*mib, 0)
	q := mustAlloc(t, a, 4096, 0)
	mustFree(t, a, p)
	a.ResetAccumulatedStats()
	r := mustAlloc(t, a, 5000, 0)
	check := func() {
		t.Helper()
		st := a.Stats()
		ps := a.PhaseStats()
		require.Len(t, ps, 1)
		assert.Equal(t, st.AllocatedBytes[stats.All], ps[0].AllocatedBytes)
		assert.Equal(t, st.Allocation[stats.All], ps[0].Allocations)
	}
	check()
	assert.False(t, a.phased)
	assert.Empty(t, a.def.ph)
	a.SetPhase("") // the first phase: nothing changes
	assert.False(t, a.phased)
	a.SetPhase("loss")
	a.SetPhase("")
	assert.True(t, a.phased)
	check()
	mustFree(t, a, q)
	mustFree(t, a, r)
	check()
	require.NoError(t, a.CheckInvariants())
}
