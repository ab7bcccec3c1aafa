// Tests of what the Recorder knows of call sites, and of Close: the
// leak report grouped by call site (or by phase without stacks), the
// out-of-memory error's largest sites, the pprof profile of live blocks by
// site, and closing attached and twice.

package record

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/pprof/profile"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/gpumemtest"
	"github.com/gpumem/gpumem/trace"
)

// The call sites the tests allocate from: each is a function of its own,
// kept out of line, so that its name is a frame of the recorded stack.

//go:noinline
func allocateWeights(t *testing.T, a *allocator.Allocator, n int) []device.Ptr {
	var ps []device.Ptr
	for range n {
		p, err := a.Alloc(4<<20, 0)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	return ps
}

//go:noinline
func allocateActivations(t *testing.T, a *allocator.Allocator) device.Ptr {
	p, err := a.Alloc(1<<20, 0)
	require.NoError(t, err)
	return p
}

//go:noinline
func allocateOptimizerState(t *testing.T, a *allocator.Allocator) {
	for range 2 {
		_, err := a.Alloc(12<<20, 0)
		require.NoError(t, err)
	}
}

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

// An out-of-memory error of an allocator with a stack-keeping Recorder
// attached names the call sites that hold the memory, largest first.
func TestOutOfMemoryListsCallSites(t *testing.T) {
	a := gpumemtest.New(t, gpumemtest.WithCapacity(64<<20), gpumemtest.AllowLeaks())
	rec := New(trace.NewWriter(io.Discard), Options{Stacks: true})
	defer a.Attach(rec)()

	allocateWeights(t, a, 3)         // 3 x 4 MiB, from one 20 MiB segment
	allocateOptimizerState(t, a)     // 2 x 12 MiB, two 20 MiB segments
	act := allocateActivations(t, a) // 1 MiB, in the weights' segment
	_, err := a.Alloc(30<<20, 0)
	var oom *allocator.OutOfMemoryError
	require.ErrorAs(t, err, &oom)
	require.Len(t, oom.Sites, 3)
	assert.Contains(t, oom.Sites[0].Site, "record.allocateOptimizerState (sites_test.go:")
	assert.EqualValues(t, 24<<20, oom.Sites[0].Bytes)
	assert.Equal(t, 2, oom.Sites[0].Blocks)
	assert.Contains(t, oom.Sites[1].Site, "record.allocateWeights (sites_test.go:")
	assert.EqualValues(t, 12<<20, oom.Sites[1].Bytes)
	assert.Contains(t, oom.Sites[2].Site, "record.allocateActivations (sites_test.go:")
	assert.EqualValues(t, 1<<20, oom.Sites[2].Bytes)
	var total uint64
	for _, s := range oom.Sites {
		total += s.Bytes
	}
	assert.Equal(t, oom.Allocated, total, "the sites account for every allocated byte")
	msg := oom.Error()
	assert.Contains(t, msg, "Largest allocations by call site: github.com/gpumem/gpumem/trace/record.allocateOptimizerState (sites_test.go:")
	assert.Contains(t, msg, "24.00 MiB in 2 blocks")

	require.NoError(t, a.Free(act))
	sites := rec.LargestSites(10)
	require.Len(t, sites, 2, "a freed block leaves its site")
	assert.Len(t, rec.LargestSites(1), 1)
	assert.Nil(t, rec.LargestSites(0))
	assert.Nil(t, New(trace.NewWriter(io.Discard), Options{}).LargestSites(5), "no stacks, no sites")
}

func TestRecorderClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run.trace.gz")
	w, err := trace.Create(path, "closed by the Recorder")
	require.NoError(t, err)
	a := gpumemtest.New(t, gpumemtest.AllowLeaks())
	rec := New(w, Options{})
	detach := a.Attach(rec)
	p, err := a.Alloc(1<<20, device.DefaultStream)
	require.NoError(t, err)
	require.NoError(t, a.Free(p))
	require.NoError(t, rec.Close(), "Close works attached, too")
	_, err = a.Alloc(4096, device.DefaultStream)
	require.NoError(t, err, "the allocator goes on; the Recorder ignores it")
	detach()
	require.NoError(t, rec.Close(), "closing twice is harmless")
	require.NoError(t, rec.Err())
	require.NoError(t, rec.Flush())
	assert.Error(t, rec.Mark("late"), "nothing is written after Close")
	assert.Error(t, rec.SyncDevice())

	r, err := trace.Open(path) // a finished gzip file
	require.NoError(t, err)
	defer r.Close()
	var ops []string
	for {
		op, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		ops = append(ops, op.String())
	}
	assert.Equal(t, "a 0 1048576 0|f 0", strings.Join(ops, "|"))
	_, err = os.Stat(path)
	require.NoError(t, err)
}

func TestWriteProfileByCallSite(t *testing.T) {
	a := gpumemtest.New(t, gpumemtest.AllowLeaks())
	rec := New(trace.NewWriter(io.Discard), Options{Stacks: true})
	defer a.Attach(rec)()

	allocateWeights(t, a, 3)
	act := allocateActivations(t, a)
	freed := allocateActivations(t, a)
	require.NoError(t, a.Free(freed))

	var buf bytes.Buffer
	require.NoError(t, rec.WriteProfile(&buf))
	p, err := profile.Parse(&buf)
	require.NoError(t, err)
	require.NoError(t, p.CheckValid())

	bySite := map[string][2]int64{}
	for _, s := range p.Sample {
		for _, loc := range s.Location {
			for _, l := range loc.Line {
				for _, site := range []string{"allocateWeights", "allocateActivations"} {
					if strings.HasSuffix(l.Function.Name, "."+site) {
						v := bySite[site]
						bySite[site] = [2]int64{v[0] + s.Value[0], v[1] + s.Value[1]}
					}
				}
			}
		}
	}
	assert.Equal(t, [2]int64{3, 12 << 20}, bySite["allocateWeights"])
	assert.Equal(t, [2]int64{1, 1 << 20}, bySite["allocateActivations"], "the freed block is not live")
	_ = act
}
