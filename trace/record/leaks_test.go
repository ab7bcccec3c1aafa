package record

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/gpumemtest"
	"github.com/gpumem/gpumem/trace"
)

// cacheActivation keeps a 4 KiB block per step, as a list never cleared.
//
//go:noinline
func cacheActivation(t *testing.T, a *allocator.Allocator) {
	_, err := a.Alloc(4096, device.DefaultStream)
	require.NoError(t, err)
}

//go:noinline
func temporary(t *testing.T, a *allocator.Allocator) {
	p, err := a.Alloc(4096, device.DefaultStream)
	require.NoError(t, err)
	require.NoError(t, a.Free(p))
}

// TestLeaksByCallSite: with stacks recorded, the allocator's leak report
// groups by call site, so that two sites allocating the same size in the
// same phase are told apart, and the recorded trace carries the phases and
// step marks.
func TestLeaksByCallSite(t *testing.T) {
	a := gpumemtest.New(t, gpumemtest.AllowLeaks())
	var buf bytes.Buffer
	w := trace.NewWriter(&buf, "leak test")
	rec := New(w, Options{Stacks: true})
	a.Attach(rec)
	for step := range 4 {
		a.MarkStep(fmt.Sprint("step ", step))
		a.SetPhase("forward pass")
		cacheActivation(t, a)
		temporary(t, a)
	}
	a.MarkStep("end")
	leaks := a.Leaks()
	require.Len(t, leaks, 1, "%+v", leaks)
	assert.Contains(t, leaks[0].Site, "cacheActivation")
	assert.EqualValues(t, 4096, leaks[0].Size)
	assert.EqualValues(t, 4, leaks[0].Count())
	assert.Contains(t, a.Summary(false), "cacheActivation")

	require.NoError(t, rec.Close())
	out := buf.String()
	assert.Contains(t, out, "\nt forward_pass\n", "the phase, as one field")
	assert.Contains(t, out, "\nm step_0\n")
	assert.Contains(t, out, "\nm end\n")
	r, err := trace.NewReader(strings.NewReader(out))
	require.NoError(t, err)
	v := trace.NewValidator()
	for {
		op, err := r.Next()
		if err != nil {
			break
		}
		_, err = v.Check(op, r.Line())
		require.NoError(t, err)
	}
}

func TestLeaksWithoutStacksGroupByPhase(t *testing.T) {
	a := gpumemtest.New(t, gpumemtest.AllowLeaks())
	w := trace.NewWriter(&bytes.Buffer{}, "")
	rec := New(w, Options{})
	a.Attach(rec)
	_, ok := rec.Leaks()
	assert.False(t, ok)
	for step := range 4 {
		a.MarkStep(fmt.Sprint(step))
		a.SetPhase("fwd")
		cacheActivation(t, a)
	}
	a.MarkStep("end")
	leaks := a.Leaks()
	require.Len(t, leaks, 1)
	assert.Equal(t, "fwd", leaks[0].Phase)
	assert.Empty(t, leaks[0].Site)
}
