package allocator_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/gpumemtest"
)

// plannedGiB returns an allocator under the planned policy on a device
// of 1 GiB, and its Alloc on the default stream and Free, which fail t
// on an error.
func plannedGiB(t *testing.T) (*allocator.Allocator, func(uint64) device.Ptr, func(device.Ptr)) {
	a := gpumemtest.New(t, gpumemtest.WithCapacity(1<<30), gpumemtest.WithConfig(allocator.Config{Policy: allocator.PolicyPlanned}))
	alloc := func(n uint64) device.Ptr {
		p, err := a.Alloc(n, 0)
		require.NoError(t, err)
		return p
	}
	return a, alloc, func(p device.Ptr) { require.NoError(t, a.Free(p)) }
}

// TestPlannedPacksAgainByBestFit runs marked steps of three blocks: A
// (4 MiB) and C (1 MiB) allocated, A freed, B (2 MiB) allocated in A's
// memory, then B and C freed. The second step repeats the first and is
// planned at the third's mark, in time order, which packs the step into
// its peak (5 MiB: A and C; B in the gap A leaves). A step that frees A only after B's
// allocation keeps the plan (the same requests, in the same order) but
// finds B's place taken, and B is served online: a skip. At the next
// mark the plan is packed again by best fit, once: the steps after it,
// skipping or not, are served from it, and pack nothing more.
func TestPlannedPacksAgainByBestFit(t *testing.T) {
	a, alloc, free := plannedGiB(t)
	const mib = 1 << 20
	step := func(late bool) {
		a.MarkStep("")
		pa, pc := alloc(4*mib), alloc(mib)
		if !late {
			free(pa)
		}
		pb := alloc(2 * mib)
		if late {
			free(pa)
		}
		free(pb)
		free(pc)
	}
	for range 3 {
		step(false)
	}
	st, ok := a.PlanStats()
	require.True(t, ok)
	require.EqualValues(t, 1, st.Plans)
	require.EqualValues(t, 3, st.Served, "the third step, served whole")
	how, ok := a.PlanPacking()
	require.True(t, ok)
	require.Equal(t, "time", how, "the step is packed in time order")
	assert.EqualValues(t, 6*mib, st.ArenaBytes, "the arena: 5 MiB in whole pages")

	step(true) // B's place is A's, still in use: B skips
	st, _ = a.PlanStats()
	require.EqualValues(t, 1, st.Skips)
	require.EqualValues(t, 5, st.Served, "A and C")
	require.Zero(t, st.Repacks, "packed again at the next mark")

	step(false)
	st, _ = a.PlanStats()
	how, _ = a.PlanPacking()
	assert.Equal(t, "best", how, "packed again by best fit")
	assert.EqualValues(t, 1, st.Repacks)
	assert.EqualValues(t, 1, st.Plans, "packed again, not planned again")
	assert.EqualValues(t, 8, st.Served, "the step after the skip, served whole")

	step(true)
	step(false)
	step(false)
	st, _ = a.PlanStats()
	assert.EqualValues(t, 1, st.Repacks, "a plan packed by best fit is not packed again")
	assert.EqualValues(t, 2, st.Skips)
	assert.EqualValues(t, 16, st.Served)
	assert.Zero(t, st.Departures)
	require.NoError(t, a.CheckInvariants())
}

// TestPlannedPacksALooseStepByFirstFit runs marked steps of three
// blocks: X (1 MiB) allocated, Y (4 MiB), X freed, Z (2 MiB), then Y and
// Z freed. In time order Z finds X's gap too small and goes on top: 7 MiB
// for a step whose peak is 6 MiB (Y and Z), more than 1 % above it. So
// the plan is packed by first fit at once (Y, then Z above it, then X
// above Y while Z is not yet in use): 6 MiB, three pages. The second
// step repeats the first and is planned at the third's mark, and the
// three steps from there are served whole.
func TestPlannedPacksALooseStepByFirstFit(t *testing.T) {
	a, alloc, free := plannedGiB(t)
	const mib = 1 << 20
	for range 5 {
		a.MarkStep("")
		px, py := alloc(mib), alloc(4*mib)
		free(px)
		pz := alloc(2 * mib)
		free(py)
		free(pz)
	}
	st, ok := a.PlanStats()
	require.True(t, ok)
	require.EqualValues(t, 1, st.Plans)
	how, ok := a.PlanPacking()
	require.True(t, ok)
	assert.Equal(t, "first", how, "a packing in time order 1/6 above the peak is made by first fit")
	assert.EqualValues(t, 6*mib, st.ArenaBytes, "the arena: the step's peak, three pages")
	assert.EqualValues(t, 3*3, st.Served, "the third to fifth steps, served whole")
	assert.Zero(t, st.Repacks+st.Skips+st.Departures)
	require.NoError(t, a.CheckInvariants())
}
