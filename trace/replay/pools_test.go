package replay

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/internal/simtest"
	"github.com/gpumem/gpumem/trace"
)

// runPools replays the memtrace text on a fresh allocator with cfg on a
// simulated device of capacity bytes.
func runPools(t *testing.T, text string, capacity uint64, cfg allocator.Config) (*Result, *allocator.Allocator, error) {
	t.Helper()
	a, dev := newAllocator(t, capacity, cfg)
	rd, err := trace.NewReader(strings.NewReader(text))
	require.NoError(t, err)
	res, err := Run(rd, a, dev, Options{})
	return res, a, err
}

func TestReplayPools(t *testing.T) {
	const text = `# memtrace v1 source=test
P kv no_split
P graph use_on_oom
u kv 1
a 0 4096 1
a 1 1048576 1
u - 1
a 2 4096 1
g graph 2
a 3 30000000 2
f 3
a 4 30000000 2
e 2
a 5 512 2
d graph
f 4
f 5
`
	res, a, err := runPools(t, text, 1<<30, allocator.Config{})
	require.NoError(t, err)
	require.Len(t, res.Pools, 1, "graph was dropped")
	kv := res.Pools["kv"]
	// no_split: each request took a whole 2 MiB small segment.
	assert.Equal(t, PoolResult{Allocated: 4 << 20, Reserved: 4 << 20, PeakReserved: 4 << 20}, kv)
	// The graph pool is gone with its last block: reserved is the kv
	// pool's two segments and the default pool's small segments of
	// streams 1 and 2.
	assert.Equal(t, int64(8<<20), res.Stats["reserved_bytes.all.current"])
	segs := a.Snapshot()
	ids := map[uint64]int{}
	for _, s := range segs {
		ids[s.PoolID]++
	}
	assert.Equal(t, map[uint64]int{0: 2, 1: 2}, ids)

	b, err := json.Marshal(res)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"pools":{"kv":{"allocated_bytes":4194304,"reserved_bytes":4194304,"peak_reserved_bytes":4194304,"paused":false}}`)
}

func TestReplayPoolLineErrors(t *testing.T) {
	cases := []struct {
		text, msg string
	}{
		{"u kv 1\n", `memtrace line 1: "u kv 1": no pool named "kv"`},
		{"P kv\nP kv\n", `memtrace line 2: "P kv": pool "kv" exists`},
		{"P kv\nu kv 1\nu kv 1\n", "already routed"},
		{"P kv\nd kv\nd kv\n", "no pool named \"kv\""},
		{"e 1\n", "not capturing"},
		{"P kv\ng kv 1\nd kv\n", "in use"},
		{"P kv\nz kv\nz kv\n", `memtrace line 3: "z kv": pool "kv" is paused already`},
		{"P kv\nw kv\n", "not paused"},
		{"u - 1\n", "not routed"},
	}
	for _, c := range cases {
		t.Run(c.text, func(t *testing.T) {
			_, _, err := runPools(t, c.text, 1<<30, allocator.Config{})
			require.ErrorContains(t, err, c.msg)
		})
	}
}

func TestReplayPoolsOnPassthrough(t *testing.T) {
	dev := simtest.New(t, simtest.Capacity(1<<30))
	p, err := allocator.NewPassthrough(dev)
	require.NoError(t, err)
	rd, err := trace.NewReader(strings.NewReader("a 0 512\nP kv\nf 0\n"))
	require.NoError(t, err)
	_, err = Run(rd, p, dev, Options{})
	require.ErrorContains(t, err, `memtrace line 2: "P kv": the replayed allocator keeps no pools: pool lines need the caching allocator`)
}

// TestReplaySleepAndWake: on an 8 GiB device, 6 GiB live in a paused pool
// leave room for 6 GiB elsewhere; after that is freed, the pool resumes
// with the same addresses.
func TestReplaySleepAndWake(t *testing.T) {
	var b strings.Builder
	b.WriteString("# memtrace v1 source=test\nP model\nu model 0\n")
	for i := range 6 {
		fmt.Fprintf(&b, "a %d %d 0\n", i, 1<<30)
	}
	b.WriteString("u - 0\nm asleep\nz model\na 6 6442450944 0\nm awake\nf 6\nw model\nm resumed\n")
	a, dev := newAllocator(t, 8<<30, allocator.Config{ExpandableSegments: true})
	live := func() []device.Ptr {
		var ps []device.Ptr
		for _, s := range a.Snapshot() {
			for _, bl := range s.Blocks {
				if s.PoolID == 1 && bl.State == allocator.BlockAllocated {
					ps = append(ps, bl.Ptr)
				}
			}
		}
		return ps
	}
	seen := map[string][]device.Ptr{}
	var paused []bool
	rd, err := trace.NewReader(strings.NewReader(b.String()))
	require.NoError(t, err)
	res, err := Run(rd, a, dev, Options{Mark: func(name string) {
		seen[name] = live()
		paused = append(paused, a.PoolNamed("model").Paused())
	}})
	require.NoError(t, err)
	assert.Zero(t, res.OOMs, "the 6 GiB fit while the pool slept")
	require.Len(t, seen["asleep"], 6)
	assert.Equal(t, seen["asleep"], seen["resumed"], "the same addresses after the resume")
	assert.Equal(t, []bool{false, true, false}, paused)
	pr := res.Pools["model"]
	assert.Equal(t, uint64(6<<30), pr.Allocated)
	assert.Equal(t, uint64(6<<30+16<<20), pr.Reserved, "6 GiB in 20 MiB pages")
	assert.Equal(t, pr.Reserved, pr.PeakReserved)
	assert.False(t, pr.Paused)
	assert.Less(t, res.PeakReserved, int64(7<<30), "the pool's 6 GiB and the default pool's were never reserved at once")
}
