// The fault matrix: every kind of device call, failed at a spread of
// points, under the default configuration, expandable segments and the
// low_fragmentation policy, over two workloads. After every failure the invariants hold; at the end,
// with everything freed and the cache emptied, the device holds nothing:
// no memory, no reservation, no event, and every current stat is zero.

package allocator_test

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/faulty"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/trace"
)

var matrixFull = flag.Bool("faultmatrix.full", false, "run the fault matrix at every N up to 200")

// workloadOp is one step of a matrix workload.
type workloadOp struct {
	kind   byte // 'a' alloc, 'f' free, 'r' record stream, 'c' empty cache, 's' complete a stream
	id     int
	size   uint64
	stream int // index into the workload's streams
}

// randomMixedOps returns the first n allocations and frees of the shared
// random_mixed trace.
func randomMixedOps(t *testing.T, n int) []workloadOp {
	r, err := trace.Open("../trace/replay/testdata/pytorch/random_mixed.trace.gz")
	require.NoError(t, err)
	defer r.Close()
	var ops []workloadOp
	for len(ops) < n {
		op, err := r.Next()
		require.NoError(t, err)
		switch op.Kind {
		case trace.Alloc:
			ops = append(ops, workloadOp{kind: 'a', id: int(op.ID), size: op.Size})
		case trace.Free:
			ops = append(ops, workloadOp{kind: 'f', id: int(op.ID)})
		}
	}
	return ops
}

// fourStreamOps is a deterministic workload on four streams with
// RecordStream, busy streams that complete later, and cache flushes.
func fourStreamOps(n int) []workloadOp {
	rng := rand.New(rand.NewPCG(7, 11))
	var ops []workloadOp
	var live []int
	next := 0
	for len(ops) < n {
		switch k := rng.IntN(20); {
		case k < 9 || len(live) == 0:
			size := uint64(rng.IntN(3<<20) + 1)
			if rng.IntN(5) == 0 {
				size = uint64(rng.IntN(64<<20) + 1)
			}
			ops = append(ops, workloadOp{kind: 'a', id: next, size: size, stream: rng.IntN(4)})
			live = append(live, next)
			next++
		case k < 16:
			i := rng.IntN(len(live))
			id := live[i]
			if rng.IntN(3) == 0 {
				ops = append(ops, workloadOp{kind: 'r', id: id, stream: rng.IntN(4)})
			}
			ops = append(ops, workloadOp{kind: 'f', id: id})
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
		case k < 18:
			ops = append(ops, workloadOp{kind: 's', stream: rng.IntN(4)})
		default:
			ops = append(ops, workloadOp{kind: 'c'})
		}
	}
	return ops
}

type matrixRun struct {
	t       *testing.T
	inner   *sim.Device
	a       *allocator.Allocator
	streams []device.Stream
	live    map[int]device.Ptr
	failed  int // calls that returned an error
}

func (m *matrixRun) check(what string) {
	m.t.Helper()
	if err := m.a.CheckInvariants(); err != nil {
		m.t.Fatalf("after %s: %v", what, err)
	}
}

func (m *matrixRun) apply(op workloadOp) {
	var err error
	switch op.kind {
	case 'a':
		var p device.Ptr
		p, err = m.a.Alloc(op.size, m.streams[op.stream])
		if err == nil {
			m.live[op.id] = p
		}
	case 'f':
		p, ok := m.live[op.id]
		if !ok {
			return
		}
		if err = m.a.Free(p); err == nil {
			delete(m.live, op.id)
		}
	case 'r':
		if p, ok := m.live[op.id]; ok {
			err = m.a.RecordStream(p, m.streams[op.stream])
		}
	case 's':
		_ = m.inner.CompleteStream(m.streams[op.stream])
	case 'c':
		err = m.a.EmptyCache()
	}
	if err != nil {
		m.failed++
		m.check(fmt.Sprintf("a failed %c op (%v)", op.kind, err))
	}
}

// finish frees everything, completes every stream and empties the cache
// (the one injected fault has fired or never will), then checks that the
// device holds nothing.
func (m *matrixRun) finish() {
	t := m.t
	t.Helper()
	for id, p := range m.live {
		require.NoError(t, m.a.Free(p), "freeing block %d at the end", id)
	}
	require.NoError(t, m.inner.Synchronize())
	var err error
	for range 3 { // a fault that fires inside EmptyCache leaves work for the next
		if err = m.a.EmptyCache(); err == nil {
			break
		}
	}
	require.NoError(t, err)
	m.check("the final EmptyCache")
	c := m.inner.Counters()
	require.Zero(t, m.inner.BytesInUse(), "device memory left")
	require.Empty(t, m.inner.Reservations(), "address reservations left")
	require.Equal(t, c.EventsRecorded, c.EventsReleased, "events left")
	st := m.a.Stats()
	for k, v := range st.Entries() {
		if len(k) > 8 && k[len(k)-8:] == ".current" {
			require.Zero(t, v, k)
		}
	}
}

func TestFaultMatrix(t *testing.T) {
	workloads := map[string][]workloadOp{
		"random_mixed": randomMixedOps(t, 1500),
		"four_streams": fourStreamOps(1500),
	}
	ns := []int64{1, 2, 3, 5, 8, 13, 21, 34, 55, 89}
	if allocator.SelfCheck {
		ns = ns[:3] // every operation already ends with the full check
	}
	if *matrixFull {
		ns = ns[:0]
		for n := int64(1); n <= 200; n++ {
			ns = append(ns, n)
		}
	}
	runs, fired := 0, 0
	for _, name := range []string{"random_mixed", "four_streams"} {
		ops := workloads[name]
		for _, conf := range []string{"", "expandable_segments:True", "gpumem_policy:low_fragmentation"} {
			cfg, err := allocator.ParseConf(conf)
			require.NoError(t, err)
			for call := range device.NumCalls {
				for i, n := range ns {
					errKind := error(device.ErrOutOfMemory)
					if i%2 == 1 {
						errKind = nil // a generic device error
					}
					t.Run(fmt.Sprintf("%s/%q/%s/%d", name, conf, call, n), func(t *testing.T) {
						inner, err := sim.New(sim.Config{Capacity: 24 << 30})
						require.NoError(t, err)
						j := faulty.New(inner)
						a, err := allocator.New(j.Device(), cfg)
						require.NoError(t, err)
						m := &matrixRun{t: t, inner: inner, a: a, live: map[int]device.Ptr{}, streams: []device.Stream{device.DefaultStream}}
						for range 3 {
							s, err := inner.NewStream()
							require.NoError(t, err)
							require.NoError(t, inner.SetStreamBusy(s, true))
							m.streams = append(m.streams, s)
						}
						if _, err := j.Add(faulty.Rule{Call: call, Nth: n, Err: errKind}); err != nil {
							t.Skipf("no rule for %s: %v", call, err)
						}
						for _, op := range ops {
							m.apply(op)
						}
						m.finish()
						runs++
						if len(j.Fired()) > 0 {
							fired++
						}
					})
				}
			}
		}
	}
	t.Logf("%d runs, %d with a fault that fired", runs, fired)
}
