// The fault matrix: every kind of device call, failed at a spread of
// points, under the default configuration, expandable segments and the
// low_fragmentation and planned policies, over two workloads; under the
// policies, with and without virtual memory, over a third that lends
// blocks across streams; and under the planned policy, with and without
// virtual memory, over a fourth of repeated steps (stepOps). After every failure the invariants hold; at the end, with
// everything freed and the cache emptied, the device holds nothing: no
// memory, no reservation, no event, and every current stat is zero.
//
// The matrix also checks that it tests something: in every run the fault
// fires exactly when the run makes as many calls of its kind as the rule
// waits for; every kind of call the allocator makes fails in at least
// minFired runs, and under the policy at least once while a block is
// lent; the kinds it never makes are listed and never fire.

package allocator_test

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/faulty"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/gpumemtest"
	"github.com/gpumem/gpumem/internal/simtest"
	"github.com/gpumem/gpumem/trace"
)

var matrixFull = flag.Bool("faultmatrix.full", false, "run the fault matrix at every N up to 200")

// workloadOp is one step of a matrix workload.
type workloadOp struct {
	kind   byte // 'a' alloc, 'f' free, 'r' record stream, 'c' empty cache, 's' complete a stream, 'm' mark a step
	id     int
	size   uint64
	stream int // index into the workload's streams
}

// lendingOps is a deterministic workload under which the policy lends:
// four streams (the first four of the run) that RecordStream never names
// allocate and free, so that one stream's cache serves another's
// requests; blocks are recorded on a fifth stream (the copy stream, which
// then neither lends nor borrows), so that frees wait for its events; the
// streams complete now and then, the cache is flushed, and requests larger
// than the device run the out-of-memory ladder, all while blocks are lent.
// Its first lendingPrelude operations lend a block that stays allocated to
// the end: the matrix fails calls from then on, so that every call fails
// while a block is lent.
func lendingOps(n int) []workloadOp {
	const kept = 1 << 30 // the id of the block lent by the prelude, never freed by the ops
	prelude := []workloadOp{
		{kind: 'a', id: kept - 1, size: 8 << 20, stream: 0},
		{kind: 'f', id: kept - 1},
		{kind: 'a', id: kept, size: 8 << 20, stream: 1}, // stream 1's cache is empty: stream 0 lends
	}
	return workloadMix{
		seed: [2]uint64{3, 5}, draws: 40, alloc: 18, free: 34, sync: 37, flush: 38,
		small: 2 << 20, large: 40 << 20, largeOneIn: 4,
		recordOneIn: 4, recordStream: 4, syncStreams: 5,
	}.ops(prelude, n)
}

// lendingPrelude is the number of operations that start lendingOps.
const lendingPrelude = 3

// stepOps is a training loop for the planned policy: weights kept across
// steps, then steps (each begins with a step boundary) that allocate and
// free the same blocks in the same order, but every fifth, whose
// activations are smaller (a last batch), every sixth, some of whose
// blocks are larger (a longer batch: the plan's envelope grows), and
// every seventh, which flushes the cache midway; n operations in all, on
// stream 0.
func stepOps(n int) []workloadOp {
	sizes := []uint64{3 << 20, 512, 25 << 20, 70 << 10, 12 << 20, 1 << 20, 40 << 20, 4096, 6 << 20}
	ops := []workloadOp{{kind: 'a', id: 1 << 30, size: 30 << 20}, {kind: 'a', id: 1<<30 + 1, size: 100 << 10}}
	next := 0
	for step := 0; len(ops) < n; step++ {
		ops = append(ops, workloadOp{kind: 'm'})
		first := next
		for i, size := range sizes {
			if step%5 == 4 && size > mib {
				size /= 2
			}
			if step%6 == 5 && i%2 == 1 {
				size *= 2
			}
			ops = append(ops, workloadOp{kind: 'a', id: next, size: size})
			next++
			if i%3 == 2 { // the block before last goes
				ops = append(ops, workloadOp{kind: 'f', id: next - 2})
			}
			if step%7 == 6 && i == 4 {
				ops = append(ops, workloadOp{kind: 'c'})
			}
		}
		for id := first; id < next; id++ {
			if (id-first)%3 != 1 {
				ops = append(ops, workloadOp{kind: 'f', id: id})
			}
		}
		if step%4 == 3 { // a block kept into the next step
			ops = append(ops, workloadOp{kind: 'a', id: next, size: 2 << 20})
			next++
		}
	}
	return ops[:n]
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
	return workloadMix{
		seed: [2]uint64{7, 11}, draws: 20, alloc: 9, free: 16, sync: 18, flush: 20,
		small: 3 << 20, large: 64 << 20, largeOneIn: 5,
		recordOneIn: 3, recordStream: -1, syncStreams: 4,
	}.ops(nil, n)
}

// workloadMix is the recipe of a deterministic random workload on four
// streams: each step draws k in [0, draws); k below alloc allocates (or
// any k while nothing is live), below free frees a live block, below sync
// completes a stream's work, below flush empties the cache, and the rest
// ask for more than the device has (the whole out-of-memory ladder).
type workloadMix struct {
	seed                     [2]uint64
	draws                    int
	alloc, free, sync, flush int
	small, large             int // sizes in [1, small]; one in largeOneIn in [1, large]
	largeOneIn               int
	recordOneIn              int // one free in recordOneIn is preceded by a RecordStream
	recordStream             int // on this stream; -1: on one of the four, drawn
	syncStreams              int // the streams a completion draws from
}

// ops returns the prelude followed by the mix's operations, n in all.
func (m workloadMix) ops(prelude []workloadOp, n int) []workloadOp {
	rng := rand.New(rand.NewPCG(m.seed[0], m.seed[1]))
	ops := prelude
	var live []int
	next := 0
	for len(ops) < n {
		switch k := rng.IntN(m.draws); {
		case k < m.alloc || len(live) == 0:
			size := uint64(rng.IntN(m.small) + 1)
			if rng.IntN(m.largeOneIn) == 0 {
				size = uint64(rng.IntN(m.large) + 1)
			}
			ops = append(ops, workloadOp{kind: 'a', id: next, size: size, stream: rng.IntN(4)})
			live = append(live, next)
			next++
		case k < m.free:
			i := rng.IntN(len(live))
			id := live[i]
			if rng.IntN(m.recordOneIn) == 0 {
				on := m.recordStream
				if on < 0 {
					on = rng.IntN(4)
				}
				ops = append(ops, workloadOp{kind: 'r', id: id, stream: on})
			}
			ops = append(ops, workloadOp{kind: 'f', id: id})
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
		case k < m.sync:
			ops = append(ops, workloadOp{kind: 's', stream: rng.IntN(m.syncStreams)})
		case k < m.flush:
			ops = append(ops, workloadOp{kind: 'c'})
		default:
			ops = append(ops, workloadOp{kind: 'a', id: -1, size: 1 << 40, stream: rng.IntN(4)})
		}
	}
	return ops
}

type matrixRun struct {
	t       *testing.T
	inner   *sim.Device
	j       *faulty.Injector
	a       *allocator.Allocator
	streams []device.Stream
	live    map[int]device.Ptr
	failed  int  // calls that returned an error
	lending bool // a fault fired during an operation that began or ended with a block lent
}

func (m *matrixRun) check(what string) {
	m.t.Helper()
	if err := m.a.CheckInvariants(); err != nil {
		m.t.Fatalf("after %s: %v", what, err)
	}
}

func (m *matrixRun) apply(op workloadOp) {
	fired, lent := len(m.j.Fired()), m.a.Lent()
	defer func() {
		if len(m.j.Fired()) > fired && (lent > 0 || m.a.Lent() > 0) {
			m.lending = true
		}
	}()
	var err error
	switch op.kind {
	case 'a':
		var p device.Ptr
		p, err = m.a.Alloc(op.size, m.streams[op.stream])
		if err == nil && op.id >= 0 {
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
	case 'm':
		m.a.MarkStep("step")
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

// notCalled are the kinds of device call the allocator never makes (the
// host allocator makes HostAlloc and HostFree; streams are the caller's;
// the copies and the stream-ordered pool belong to other allocators; a
// lend's waits are WaitStream calls, not WaitEvent): their faults never
// fire.
var notCalled = map[device.Call]bool{
	device.CallSynchronize: true, device.CallNewStream: true, device.CallWaitEvent: true,
	device.CallHostAlloc: true, device.CallHostFree: true,
	device.CallCopyToHost: true, device.CallCopyFromHost: true,
	device.CallMallocAsync: true, device.CallFreeAsync: true, device.CallSetReleaseThreshold: true,
	device.CallTrimPool: true, device.CallPoolUsage: true, device.CallResetPoolPeaks: true,
}

// matrixConf is a configuration of the matrix: the allocator's, and
// whether the device offers virtual memory.
type matrixConf struct {
	conf string
	noVM bool
}

func (c matrixConf) String() string {
	if c.noVM {
		return fmt.Sprintf("%q/without virtual memory", c.conf)
	}
	return fmt.Sprintf("%q", c.conf)
}

// minFired is the number of runs in which each kind of call the
// allocator makes must fail, at least, over the whole matrix (the fewest,
// memory info, which only the out-of-memory path calls, fails in 6 runs
// with the points of the self-checking build, 18 with the usual ones).
const minFired = 3

func TestFaultMatrix(t *testing.T) {
	workloads := map[string][]workloadOp{
		"random_mixed": randomMixedOps(t, 1500),
		"four_streams": fourStreamOps(1500),
		"lending":      lendingOps(1500),
		"steps":        stepOps(1500),
	}
	plain := []matrixConf{{conf: ""}, {conf: "expandable_segments:True"}, {conf: "gpumem_policy:low_fragmentation"}, {conf: "gpumem_policy:planned"}}
	confs := map[string][]matrixConf{
		"random_mixed": plain,
		"four_streams": plain,
		"lending":      {{conf: "gpumem_policy:low_fragmentation"}, {conf: "gpumem_policy:low_fragmentation", noVM: true}, {conf: "gpumem_policy:planned"}},
		"steps":        {{conf: "gpumem_policy:planned"}, {conf: "gpumem_policy:planned", noVM: true}},
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
	var runs, fired, lendingFired [device.NumCalls]int
	for _, name := range []string{"random_mixed", "four_streams", "lending", "steps"} {
		ops := workloads[name]
		for _, mc := range confs[name] {
			cfg, err := allocator.ParseConf(mc.conf)
			require.NoError(t, err)
			for call := range device.NumCalls {
				points := ns
				if notCalled[call] {
					points = ns[:1] // one run shows that it never fires
				}
				for i, n := range points {
					errKind := error(device.ErrOutOfMemory)
					if i%2 == 1 {
						errKind = nil // a generic device error
					}
					t.Run(fmt.Sprintf("%s/%s/%s/%d", name, mc, call, n), func(t *testing.T) {
						inner := simtest.New(t, simtest.Capacity(24<<30))
						j := faulty.New(inner)
						dev := j.Device()
						if mc.noVM {
							caps := device.CapabilitiesOf(dev)
							caps.VirtualMemory = nil
							dev = device.Compose(dev, caps)
						}
						a := gpumemtest.NewOn(t, dev, gpumemtest.WithConfig(cfg))
						m := &matrixRun{t: t, inner: inner, j: j, a: a, live: map[int]device.Ptr{}, streams: simtest.Streams(t, inner, 4)}
						for _, s := range m.streams[1:] {
							require.NoError(t, inner.SetStreamBusy(s, true))
						}
						prelude := 0
						if name == "lending" {
							prelude = lendingPrelude
							for _, op := range ops[:prelude] {
								m.apply(op)
							}
							require.Equal(t, 1, a.Lent(), "the prelude lends a block")
						}
						base := j.Calls(call)
						if _, err := j.Add(faulty.Rule{Call: call, Nth: n, Err: errKind}); err != nil {
							t.Fatalf("no rule for %s: %v", call, err)
						}
						for _, op := range ops[prelude:] {
							m.apply(op)
						}
						m.finish()
						made := j.Calls(call) - base
						require.Equal(t, made >= n, len(j.Fired()) == 1,
							"%d %s calls were made after the rule for the %dth; faults fired: %v", made, call, n, j.Fired())
						runs[call]++
						if len(j.Fired()) > 0 {
							fired[call]++
						}
						if m.lending {
							lendingFired[call]++
						}
					})
				}
			}
		}
	}
	total := 0
	for call := range device.NumCalls {
		total += fired[call]
		t.Logf("%-18s %4d runs, %4d with a fault that fired, %3d of them while a block was lent", call, runs[call], fired[call], lendingFired[call])
		if t.Failed() {
			continue // a run that failed may have stopped before its fault
		}
		if notCalled[call] {
			assert.Zero(t, fired[call], "%s: the allocator makes no such call", call)
			continue
		}
		assert.GreaterOrEqual(t, fired[call], minFired,
			"%s: faults fired in %d of %d runs: the workloads hardly make the call", call, fired[call], runs[call])
		assert.Positive(t, lendingFired[call], "%s: no fault fired while a block was lent", call)
	}
	t.Logf("%d runs with a fault that fired", total)
}

// TestStepOpsArePlanned: the matrix's step workload, run without a
// fault, takes the paths it is there for: steps planned, and planned
// again, requests served from an arena, departures (a longer batch, a
// flush midway, a block kept into the next step, spared). 2 plans, 631
// requests served, 20 departures; 15, 226 and 15 before the longer
// batches and the steps of another shape spared.
func TestStepOpsArePlanned(t *testing.T) {
	inner := simtest.New(t, simtest.Capacity(24<<30))
	j := faulty.New(inner)
	a := gpumemtest.NewOn(t, j.Device(), gpumemtest.WithConfig(allocator.Config{Policy: allocator.PolicyPlanned}))
	m := &matrixRun{t: t, inner: inner, j: j, a: a, live: map[int]device.Ptr{}, streams: simtest.Streams(t, inner, 4)}
	for _, op := range stepOps(1500) {
		m.apply(op)
	}
	st, ok := a.PlanStats()
	require.True(t, ok)
	assert.Greater(t, st.Plans, int64(1), "plans")
	assert.Positive(t, st.Served, "requests served from an arena")
	assert.Positive(t, st.Departures, "departures")
	m.finish()
}
