package allocator

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/internal/simtest"
	"github.com/gpumem/gpumem/stats"
)

func phaseNamed(t *testing.T, a *Allocator, name string) stats.PhaseStats {
	t.Helper()
	for _, ph := range a.PhaseStats() {
		if ph.Name == name {
			return ph
		}
	}
	t.Fatalf("no phase %q in %+v", name, a.PhaseStats())
	return stats.PhaseStats{}
}

func TestPhasesCountTheirBlocks(t *testing.T) {
	a, _ := newTest(t, 0, Config{})
	w := mustAlloc(t, a, 4*mib, 0) // before any phase: phase ""
	assert.Equal(t, "", a.SetPhase("forward"))
	x := mustAlloc(t, a, 3*mib, 0)
	y := mustAlloc(t, a, 1000, 0)
	restore := a.EnterPhase("backward")
	assert.Equal(t, "backward", a.Phase())
	mustFree(t, a, x) // a forward block freed in backward counts against forward
	g := mustAlloc(t, a, 2*mib, 0)
	restore()
	assert.Equal(t, "forward", a.Phase(), "the scope restores the phase before it")

	fwd := phaseNamed(t, a, "forward")
	assert.EqualValues(t, 1024, fwd.AllocatedBytes.Current)
	assert.EqualValues(t, 3*mib+1024, fwd.AllocatedBytes.Peak)
	assert.EqualValues(t, 2, fwd.Allocations.Allocated)
	assert.EqualValues(t, 1, fwd.Allocations.Current)
	bwd := phaseNamed(t, a, "backward")
	assert.EqualValues(t, 2*mib, bwd.AllocatedBytes.Current)
	assert.EqualValues(t, 4*mib, phaseNamed(t, a, "").AllocatedBytes.Current)
	var sum int64
	for _, ph := range a.PhaseStats() {
		sum += ph.AllocatedBytes.Current
	}
	assert.Equal(t, a.Stats().Allocated(), sum, "the phases add up to allocated_bytes")

	a.ResetPeakStats()
	assert.EqualValues(t, 1024, phaseNamed(t, a, "forward").AllocatedBytes.Peak)
	a.ResetAccumulatedStats()
	assert.EqualValues(t, 0, phaseNamed(t, a, "forward").Allocations.Allocated)
	for _, p := range []device.Ptr{w, y, g} {
		mustFree(t, a, p)
	}
}

func TestPhaseNamesAreBounded(t *testing.T) {
	a, _ := newTest(t, 0, Config{})
	for i := range maxPhases + 10 {
		a.SetPhase(fmt.Sprint("p", i))
		mustFree(t, a, mustAlloc(t, a, 512, 0))
	}
	assert.Len(t, a.PhaseStats(), maxPhases)
	assert.Equal(t, otherPhase, a.Phase())
	assert.EqualValues(t, 11, phaseNamed(t, a, otherPhase).Allocations.Allocated)
}

// TestLeakAmongLongLivedState plants a leak among state made once: weights
// before the first step, optimizer moments in the first step, activations
// freed every step, and one list that keeps a block of every step. Only
// the list is reported.
func TestLeakAmongLongLivedState(t *testing.T) {
	a, _ := newTest(t, 0, Config{})
	a.SetPhase("load")
	for range 4 {
		mustAlloc(t, a, 8*mib, 0) // weights
	}
	for step := range 5 {
		a.MarkStep(fmt.Sprint("step", step))
		a.SetPhase("forward")
		var acts []device.Ptr
		for range 3 {
			acts = append(acts, mustAlloc(t, a, 6*mib, 0))
		}
		mustAlloc(t, a, 4096, 0) // the leak: kept by a list that is never cleared
		a.SetPhase("backward")
		for _, p := range acts {
			mustFree(t, a, p)
		}
		a.SetPhase("optimizer")
		if step == 0 {
			for range 8 {
				mustAlloc(t, a, 8*mib, 0) // Adam moments: made once
			}
		}
	}
	a.MarkStep("end")
	leaks := a.Leaks()
	require.Len(t, leaks, 1, "%+v", leaks)
	l := leaks[0]
	assert.Equal(t, "forward", l.Phase)
	assert.EqualValues(t, 4096, l.Size)
	assert.EqualValues(t, 5, l.Count())
	assert.Equal(t, 5, l.Grew)
	assert.Equal(t, []int64{0, 1, 2, 3, 4, 5}, l.Alive)

	sum := a.Summary(false)
	assert.Contains(t, sum, "Memory by phase")
	assert.Contains(t, sum, "| forward ")
	assert.Contains(t, sum, "possible leaks")
}

func TestNoLeakWithoutSteps(t *testing.T) {
	a, _ := newTest(t, 0, Config{})
	mustAlloc(t, a, 4096, 0)
	a.MarkStep("1")
	mustAlloc(t, a, 4096, 0)
	a.MarkStep("2")
	assert.Empty(t, a.Leaks(), "growth at one boundary is not enough")
	mustAlloc(t, a, 4096, 0)
	a.MarkStep("3")
	assert.Len(t, a.Leaks(), 1, "growth at two boundaries is")
	assert.NotContains(t, newTestSummary(t), "Memory by phase", "no phase section without phases")
}

func newTestSummary(t *testing.T) string {
	a, _ := newTest(t, 0, Config{})
	return a.Summary(false)
}

func TestOutOfMemoryAnswersTheFlow(t *testing.T) {
	dev := simtest.New(t, simtest.Capacity(100*mib))
	// The allocator sees the device through a wrapper that does not report
	// usage: it is not the device's only user here, as the invariant
	// checker would otherwise assume.
	a := onDevice(t, struct{ device.Device }{dev}, Config{})
	a.SetPhase("forward")
	mustAlloc(t, a, 40*mib, 0)
	a.SetPhase("backward")
	mustAlloc(t, a, 20*mib, 0)
	other, err := dev.Malloc(30 * mib) // another user of the device
	require.NoError(t, err)
	_, err = a.Alloc(30*mib, 0)
	var oom *OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	assert.Equal(t, "backward", oom.Phase)
	assert.Equal(t, []PhaseBytes{{"forward", 40 * mib}, {"backward", 20 * mib}}, oom.LiveByPhase)
	assert.EqualValues(t, 30*mib, oom.HeldElsewhere)
	msg := err.Error()
	assert.Contains(t, msg, `failed in phase "backward"`)
	assert.Contains(t, msg, `"forward" 40.00 MiB`)
	assert.Contains(t, msg, "30.00 MiB of device memory is held outside this allocator")
	assert.False(t, strings.Contains(msg, "\n"), "one line")
	require.NoError(t, dev.Free(other))
}

type fakeSites struct{ observerFunc }

func (fakeSites) LargestSites(n int) []SiteBytes {
	return []SiteBytes{{Site: "main.train (train.go:42)", Bytes: 40 * mib, Blocks: 2}}[:min(n, 1)]
}

func TestOutOfMemoryListsCallSites(t *testing.T) {
	a, _ := newOn(t, Config{}, simtest.Capacity(100*mib))
	a.Attach(fakeSites{observerFunc(func(Action) {})})
	_, err := a.Alloc(200*mib, 0)
	var oom *OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	require.Len(t, oom.Sites, 1)
	assert.Contains(t, err.Error(), "Largest allocations by call site: main.train (train.go:42) 40.00 MiB in 2 blocks")
}

func TestPhaseAndStepActions(t *testing.T) {
	a, _ := newTest(t, 0, Config{})
	var got []Action
	a.Attach(observerFunc(func(e Action) { got = append(got, e) }))
	a.SetPhase("forward")
	p := mustAlloc(t, a, 512, 0)
	a.MarkStep("s1")
	mustFree(t, a, p)
	require.Len(t, got, 6)
	assert.Equal(t, Action{Kind: ActionPhase, Phase: "forward"}, got[0])
	assert.Equal(t, "forward", got[2].Phase, "the alloc carries its phase")
	assert.Equal(t, Action{Kind: ActionStep, Step: "s1", Phase: "forward"}, got[3])
	assert.Equal(t, "forward", got[4].Phase)
	assert.Equal(t, "forward", got[5].Phase, "free_completed too")
	assert.Equal(t, "step", ActionStep.String())
}
