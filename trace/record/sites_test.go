// Tests of the Recorder as a SiteReporter and of Close.

package record

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/gpumemtest"
	"github.com/gpumem/gpumem/trace"
)

//go:noinline
func allocateOptimizerState(t *testing.T, a *allocator.Allocator) {
	for range 2 {
		_, err := a.Alloc(12<<20, 0)
		require.NoError(t, err)
	}
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
	assert.Contains(t, oom.Sites[1].Site, "record.allocateWeights (profile_test.go:")
	assert.EqualValues(t, 12<<20, oom.Sites[1].Bytes)
	assert.Contains(t, oom.Sites[2].Site, "record.allocateActivations (profile_test.go:")
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
