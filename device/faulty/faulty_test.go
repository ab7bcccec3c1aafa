package faulty_test

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/faulty"
	"github.com/gpumem/gpumem/device/internal/devicetest"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/simtest"
)

const mib = 1 << 20

func newSim(t *testing.T) *sim.Device {
	t.Helper()
	return simtest.New(t, simtest.Capacity(64*mib), simtest.HostCapacity(mib))
}

func add(t *testing.T, j *faulty.Injector, r faulty.Rule) int {
	t.Helper()
	id, err := j.Add(r)
	require.NoError(t, err)
	return id
}

// simState is everything observable about a simulated device, its clock
// included: a call that never reached it leaves all of it unchanged.
type simState struct {
	Allocs   []sim.Range
	Resv     []sim.Reservation
	Mapped   map[device.Ptr][]sim.Range
	Counters sim.Counters
	Clock    time.Duration
	Pending  []uint64
	InUse    uint64
	Pool     []sim.PoolChunkInfo
	Usage    device.PoolUsage
	Content  int
}

func stateOf(t *testing.T, s *sim.Device) simState {
	t.Helper()
	st := simState{Allocs: s.Allocations(), Resv: s.Reservations(), Mapped: map[device.Ptr][]sim.Range{},
		Counters: s.Counters(), Clock: s.Clock(), InUse: s.BytesInUse(), Pool: s.PoolChunks(), Content: s.ContentPages()}
	var err error
	st.Usage, err = s.PoolUsage()
	require.NoError(t, err)
	for _, r := range st.Resv {
		st.Mapped[r.Ptr] = s.Mapped(r.Ptr)
	}
	for i := range s.Streams() { // ordinal 0: stream i's handle is i
		n, err := s.PendingWork(device.Stream(i))
		require.NoError(t, err)
		st.Pending = append(st.Pending, n)
	}
	return st
}

// TestNoRulesForwardsFaithfully runs the same script on a bare simulated
// device and on one behind an injector without rules, for every subset of
// the simulator's capabilities: same results, state and clock.
func TestNoRulesForwardsFaithfully(t *testing.T) {
	var j *faulty.Injector
	devicetest.Faithful(t, func() *sim.Device { return newSim(t) },
		func(d device.Device) device.Device {
			j = faulty.New(d)
			return j.Device()
		},
		func(i int, got devicetest.Result) {
			assert.Empty(t, j.Fired())
			for k := range device.NumCalls {
				assert.Equal(t, got.Tally.Calls[k], j.Calls(k), "subset %08b: %v calls", i, k)
			}
		})
}

// TestCapabilities: the wrapped device offers exactly what the inner one
// offers, both ways, and the allocator sees it so.
func TestCapabilities(t *testing.T) {
	devicetest.SameCapabilities(t, func() device.Device { return newSim(t) },
		func(d device.Device) device.Device { return faulty.New(d).Device() })
	// An allocator sees the same: asking for expandable segments fails
	// without virtual memory and works with it.
	noVM := device.Compose(newSim(t), device.Capabilities{})
	_, err := allocator.New(faulty.New(noVM).Device(), allocator.Config{ExpandableSegments: true})
	require.ErrorIs(t, err, device.ErrNotSupported, "no virtual memory appears by wrapping")
	_, err = allocator.New(faulty.New(newSim(t)).Device(), allocator.Config{ExpandableSegments: true})
	require.NoError(t, err, "none is lost either")
	assert.Nil(t, faulty.New(nil).Device())
}

// made returns n values that mk makes, in order, failing the test at the
// first error.
func made[T any](t *testing.T, n int, mk func() (T, error)) []T {
	t.Helper()
	out := make([]T, n)
	for i := range out {
		var err error
		out[i], err = mk()
		require.NoError(t, err)
	}
	return out
}

// callCase makes valid calls of one kind: prepare readies n of them on
// the inner device, call makes the i-th (0-based) through d, which is the
// injector's device or the inner one.
type callCase struct {
	prepare func(t *testing.T, s *sim.Device, n int) func(d device.Device, i int) error
}

func callCases() map[device.Call]callCase {
	const page = 2 * mib
	vm := func(d device.Device) device.VirtualMemory { return d.(device.VirtualMemory) }
	host := func(d device.Device) device.HostMemory { return d.(device.HostMemory) }
	copier := func(d device.Device) device.Copier { return d.(device.Copier) }
	pool := func(d device.Device) device.StreamOrderedMemory { return d.(device.StreamOrderedMemory) }
	none := func(call func(d device.Device, i int) error) callCase {
		return callCase{func(*testing.T, *sim.Device, int) func(device.Device, int) error { return call }}
	}
	// events returns n events pending on a busy stream.
	events := func(t *testing.T, s *sim.Device, n int) []device.Event {
		st, err := s.NewStream()
		require.NoError(t, err)
		require.NoError(t, s.SetStreamBusy(st, true))
		return made(t, n, func() (device.Event, error) { return s.RecordEvent(st) })
	}
	return map[device.Call]callCase{
		device.CallMalloc: none(func(d device.Device, _ int) error { _, err := d.Malloc(mib); return err }),
		device.CallFree: {func(t *testing.T, s *sim.Device, n int) func(device.Device, int) error {
			ps := made(t, n, func() (device.Ptr, error) { return s.Malloc(mib) })
			return func(d device.Device, i int) error { return d.Free(ps[i]) }
		}},
		device.CallMemInfo:     none(func(d device.Device, _ int) error { _, _, err := d.MemInfo(); return err }),
		device.CallSynchronize: none(func(d device.Device, _ int) error { return d.Synchronize() }),
		device.CallNewStream:   none(func(d device.Device, _ int) error { _, err := d.NewStream(); return err }),
		device.CallSynchronizeStream: {func(t *testing.T, s *sim.Device, n int) func(device.Device, int) error {
			events(t, s, 1) // work pending on stream 1, which a failed call must not finish
			return func(d device.Device, _ int) error { return d.SynchronizeStream(1) }
		}},
		device.CallRecordEvent: none(func(d device.Device, _ int) error { _, err := d.RecordEvent(0); return err }),
		device.CallEventDone: {func(t *testing.T, s *sim.Device, n int) func(device.Device, int) error {
			es := events(t, s, n)
			return func(d device.Device, i int) error { _, err := d.EventDone(es[i]); return err }
		}},
		device.CallSynchronizeEvent: {func(t *testing.T, s *sim.Device, n int) func(device.Device, int) error {
			es := events(t, s, n)
			return func(d device.Device, i int) error { return d.SynchronizeEvent(es[i]) }
		}},
		device.CallReleaseEvent: {func(t *testing.T, s *sim.Device, n int) func(device.Device, int) error {
			es := events(t, s, n)
			return func(d device.Device, i int) error { return d.ReleaseEvent(es[i]) }
		}},
		device.CallReserve: none(func(d device.Device, _ int) error { _, err := vm(d).Reserve(page); return err }),
		device.CallMap: {func(t *testing.T, s *sim.Device, n int) func(device.Device, int) error {
			r, err := s.Reserve(uint64(n) * page)
			require.NoError(t, err)
			return func(d device.Device, i int) error { return vm(d).Map(r+device.Ptr(i*page), page) }
		}},
		device.CallUnmap: {func(t *testing.T, s *sim.Device, n int) func(device.Device, int) error {
			r, err := s.Reserve(uint64(n) * page)
			require.NoError(t, err)
			require.NoError(t, s.Map(r, uint64(n)*page))
			return func(d device.Device, i int) error { return vm(d).Unmap(r+device.Ptr(i*page), page) }
		}},
		device.CallRelease: {func(t *testing.T, s *sim.Device, n int) func(device.Device, int) error {
			rs := made(t, n, func() (device.Ptr, error) { return s.Reserve(page) })
			return func(d device.Device, i int) error { return vm(d).Release(rs[i]) }
		}},
		device.CallWaitEvent: {func(t *testing.T, s *sim.Device, n int) func(device.Device, int) error {
			es := events(t, s, n) // pending on stream 1: a wait holds stream 2
			st, err := s.NewStream()
			require.NoError(t, err)
			return func(d device.Device, i int) error { return d.(device.StreamWaiter).WaitEvent(st, es[i]) }
		}},
		device.CallWaitStream: {func(t *testing.T, s *sim.Device, n int) func(device.Device, int) error {
			a, err := s.NewStream() // busy: each wait holds b
			require.NoError(t, err)
			require.NoError(t, s.SetStreamBusy(a, true))
			b, err := s.NewStream()
			require.NoError(t, err)
			return func(d device.Device, _ int) error { return d.(device.StreamWaiter).WaitStream(b, a) }
		}},
		device.CallCopyToHost: {func(t *testing.T, s *sim.Device, n int) func(device.Device, int) error {
			p, err := s.Malloc(mib)
			require.NoError(t, err)
			buf := make([]byte, 64)
			return func(d device.Device, i int) error { return copier(d).CopyToHost(buf, p+device.Ptr(i*64)) }
		}},
		device.CallCopyFromHost: {func(t *testing.T, s *sim.Device, n int) func(device.Device, int) error {
			p, err := s.Malloc(mib)
			require.NoError(t, err)
			return func(d device.Device, i int) error { return copier(d).CopyFromHost(p+device.Ptr(i*64), []byte{1, 2, 3}) }
		}},
		device.CallMallocAsync: none(func(d device.Device, _ int) error { _, err := pool(d).MallocAsync(mib, 0); return err }),
		device.CallFreeAsync: {func(t *testing.T, s *sim.Device, n int) func(device.Device, int) error {
			ps := made(t, n, func() (device.Ptr, error) { return s.MallocAsync(mib, 0) })
			return func(d device.Device, i int) error { return pool(d).FreeAsync(ps[i], 0) }
		}},
		device.CallSetReleaseThreshold: none(func(d device.Device, i int) error { return pool(d).SetReleaseThreshold(uint64(i)) }),
		device.CallTrimPool: {func(t *testing.T, s *sim.Device, n int) func(device.Device, int) error {
			// An idle chunk the threshold holds: the trims keep it (the
			// device counts each), but the last one returns it.
			require.NoError(t, s.SetReleaseThreshold(1<<62))
			p, err := s.MallocAsync(mib, 0)
			require.NoError(t, err)
			require.NoError(t, s.FreeAsync(p, 0))
			return func(d device.Device, i int) error {
				keep := uint64(sim.PoolChunk)
				if i == n-1 {
					keep = 0
				}
				return pool(d).TrimPool(keep)
			}
		}},
		device.CallPoolUsage:      none(func(d device.Device, _ int) error { _, err := pool(d).PoolUsage(); return err }),
		device.CallResetPoolPeaks: none(func(d device.Device, _ int) error { return pool(d).ResetPoolPeaks() }),
		device.CallHostAlloc:      none(func(d device.Device, _ int) error { _, err := host(d).HostAlloc(64); return err }),
		device.CallHostFree: {func(t *testing.T, s *sim.Device, n int) func(device.Device, int) error {
			bs := made(t, n, func() ([]byte, error) { return s.HostAlloc(64) })
			return func(d device.Device, i int) error { return host(d).HostFree(bs[i]) }
		}},
	}
}

// TestEachCallFailsAtN: for every kind of call, a rule fails exactly the
// Nth call of that kind; the failed call changes nothing in the inner
// device (its state, counters and clock), and made again on the inner
// device it succeeds; the calls before and after succeed.
func TestEachCallFailsAtN(t *testing.T) {
	cases := callCases()
	require.Len(t, cases, int(device.NumCalls), "a case for every kind of call")
	for k := range device.NumCalls {
		for _, n := range []int{1, 3} {
			for _, sentinel := range []error{nil, device.ErrOutOfMemory} {
				s := newSim(t)
				j := faulty.New(s)
				call := cases[k].prepare(t, s, n+2)
				id := add(t, j, faulty.Rule{Call: k, Nth: int64(n), Err: sentinel})
				for i := range n + 1 {
					before := stateOf(t, s)
					err := call(j.Device(), i)
					if i+1 != n {
						require.NoError(t, err, "%v call %d of rule Nth %d", k, i+1, n)
						continue
					}
					require.ErrorIs(t, err, faulty.ErrInjected, "%v call %d", k, i+1)
					if sentinel != nil {
						require.ErrorIs(t, err, sentinel)
					}
					var f *faulty.Fault
					require.ErrorAs(t, err, &f)
					require.Equal(t, faulty.Fault{Call: k, N: int64(n), Rule: id, Err: f.Err}, *f)
					require.Equal(t, before, stateOf(t, s), "%v: the failed call changed the inner device", k)
					require.NoError(t, call(s, i), "%v: the same call on the inner device", k)
				}
				require.NoError(t, call(j.Device(), n+1), "%v: once only", k)
				require.Len(t, j.Fired(), 1)
				assert.Equal(t, int64(n+2), j.Calls(k))
			}
		}
	}
}

func TestRulesCombine(t *testing.T) {
	s := newSim(t)
	j := faulty.New(s)
	d := j.Device()
	malloc := func() error { _, err := d.Malloc(mib); return err }

	// A window of three calls from the second.
	window := add(t, j, faulty.Rule{Call: device.CallMalloc, Nth: 2, Count: 3})
	var got []bool
	for range 6 {
		got = append(got, malloc() != nil)
	}
	assert.Equal(t, []bool{false, true, true, true, false, false}, got)

	// Every call from the next on; a rule added later counts from then,
	// and overlapping rules report the first added.
	always := add(t, j, faulty.Rule{Call: device.CallMalloc, Count: faulty.Always, Err: device.ErrOutOfMemory})
	once := add(t, j, faulty.Rule{Call: device.CallMalloc, Nth: 2})
	for range 3 {
		err := malloc()
		require.ErrorIs(t, err, device.ErrOutOfMemory)
		var f *faulty.Fault
		require.ErrorAs(t, err, &f)
		assert.Equal(t, always, f.Rule)
	}
	require.True(t, j.Remove(always))
	require.False(t, j.Remove(always))
	require.NoError(t, malloc(), "the once rule's window (call 2 after it) passed while the always rule fired")

	// Rules on other kinds do not touch mallocs.
	add(t, j, faulty.Rule{Call: device.CallFree, Count: faulty.Always})
	require.NoError(t, malloc())
	require.ErrorIs(t, d.Free(s.Allocations()[0].Ptr), faulty.ErrInjected)

	fired := j.Fired()
	require.Len(t, fired, 7)
	for i, f := range fired[:3] {
		assert.Equal(t, faulty.Fault{Call: device.CallMalloc, N: int64(i + 2), Rule: window, Err: faulty.ErrInjected}, f)
	}
	assert.Equal(t, int64(11), j.Calls(device.CallMalloc))
	for _, f := range fired {
		assert.NotEqual(t, once, f.Rule)
	}
	assert.Equal(t, device.CallFree, fired[6].Call)
	assert.Equal(t, int64(1), fired[6].N)

	// Clear removes every rule and the record; numbering goes on.
	j.Clear()
	assert.Empty(t, j.Fired())
	require.NoError(t, d.Free(s.Allocations()[0].Ptr))
	next := add(t, j, faulty.Rule{Call: device.CallMalloc})
	assert.Equal(t, 4, next, "ids are never reused")
	require.Error(t, malloc())
	assert.Equal(t, int64(12), j.Fired()[0].N)
	assert.Zero(t, j.Calls(device.NumCalls))
}

func TestAddRefusesBadRules(t *testing.T) {
	j := faulty.New(newSim(t))
	_, _, err := j.Device().MemInfo()
	require.NoError(t, err)
	for name, r := range map[string]faulty.Rule{
		"not a call":        {Call: device.NumCalls},
		"negative nth":      {Call: device.CallMap, Nth: -1},
		"count below -1":    {Call: device.CallMap, Count: -2},
		"nth beyond counts": {Call: device.CallMemInfo, Nth: 1<<63 - 1},
	} {
		_, err := j.Add(r)
		require.ErrorIs(t, err, device.ErrInvalidArgument, name)
	}
	// Huge but valid: nothing overflows.
	_, err = j.Add(faulty.Rule{Call: device.CallMalloc, Nth: 1<<63 - 2})
	require.NoError(t, err)
	_, err = j.Add(faulty.Rule{Call: device.CallFree, Count: 1<<63 - 1})
	require.NoError(t, err)
	_, err = j.Device().Malloc(1)
	require.NoError(t, err)
	require.ErrorIs(t, j.Device().Free(1), faulty.ErrInjected)
	assert.Len(t, j.Fired(), 1)
}

func TestFaultError(t *testing.T) {
	j := faulty.New(simtest.New(t, simtest.Ordinal(3)))
	boom := errors.New("boom")
	add(t, j, faulty.Rule{Call: device.CallMap, Nth: 2, Err: device.ErrOutOfMemory})
	add(t, j, faulty.Rule{Call: device.CallSynchronize})
	add(t, j, faulty.Rule{Call: device.CallEventDone, Err: boom})
	vm := j.Device().(device.VirtualMemory)
	r, err := vm.Reserve(8 * mib)
	require.NoError(t, err)
	require.NoError(t, vm.Map(r, 2*mib))

	err = vm.Map(r+2*mib, 2*mib)
	assert.Equal(t, "device 3: map: out of memory (injected fault: rule 0, map call 2)", err.Error())
	assert.ErrorIs(t, err, device.ErrOutOfMemory)
	assert.ErrorIs(t, err, faulty.ErrInjected)
	assert.NotErrorIs(t, err, device.ErrInvalidArgument)

	err = j.Device().Synchronize()
	assert.Equal(t, "device 3: synchronize: injected device fault (rule 1, synchronize call 1)", err.Error())
	assert.NotErrorIs(t, err, device.ErrOutOfMemory)

	e, err := j.Device().RecordEvent(0)
	require.NoError(t, err)
	done, err := j.Device().EventDone(e)
	assert.False(t, done)
	assert.ErrorIs(t, err, boom)
	assert.ErrorIs(t, err, faulty.ErrInjected)
	assert.True(t, strings.HasPrefix(err.Error(), "device 3: query event: boom"), err.Error())
}

// TestConcurrentUse: rules are evaluated in the order calls arrive; with
// many goroutines, exactly the calls in the window fail (run with -race).
func TestConcurrentUse(t *testing.T) {
	j := faulty.New(newSim(t))
	add(t, j, faulty.Rule{Call: device.CallMemInfo, Nth: 100, Count: 50})
	const workers, rounds = 8, 100
	var failed sync.Map
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range rounds {
				if _, _, err := j.Device().MemInfo(); err != nil {
					failed.Store(w*rounds+i, err)
				}
				_ = j.Fired()
			}
		})
	}
	wg.Wait()
	n := 0
	failed.Range(func(_, v any) bool {
		n++
		assert.ErrorIs(t, v.(error), faulty.ErrInjected)
		return true
	})
	assert.Equal(t, 50, n)
	calls := map[int64]bool{}
	for _, f := range j.Fired() {
		calls[f.N] = true
	}
	for c := int64(100); c < 150; c++ {
		assert.True(t, calls[c], "call %d", c)
	}
}
