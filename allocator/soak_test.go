// Soaks: long random runs of the allocator through its exported API, with
// the invariant checker, alone and under a Manager from many goroutines.
//
// Each runs briefly in a plain `go test` (under a second, without the race
// detector); the -soak flag runs them at full length:
//
//	go test ./allocator -run Soak -soak                      # 10^7 ops per configuration
//	go test ./allocator -run SoakManager -race -soak -timeout 1h
//
// and -soak.ops N sets the length of the single-allocator soak.

package allocator_test

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/gpumemtest"
	"github.com/gpumem/gpumem/internal/simtest"
)

// freeCalls makes the device's malloc, free and synchronize cost no
// simulated time; the other calls keep their costs.
var freeCalls = simtest.Costs(sim.Costs{Malloc: -1, Free: -1, Synchronize: -1})

var (
	soak    = flag.Bool("soak", false, "run the soaks at full length (10^7 operations per configuration)")
	soakOps = flag.Int("soak.ops", 0, "operations per configuration of TestSoak (default 10^7 with -soak, else 10^5 for PyTorch's defaults and half that for the others)")
)

const (
	kib = 1 << 10
	mib = 1 << 20
	gib = 1 << 30
)

// soakConfigs are the configurations the soaks run under: PyTorch's
// defaults and each policy that changes the allocator's paths.
var soakConfigs = []struct {
	name string
	conf string
}{
	{"default", ""},
	{"max_split", "max_split_size_mb:64,max_non_split_rounding_mb:256"},
	{"expandable", "expandable_segments:True"},
	{"gc_fraction", "garbage_collection_threshold:0.6,per_process_memory_fraction:0.8"},
	{"roundup", "roundup_power2_divisions:[256:4,>:8]"},
}

// soakSize draws a request size: mostly small, some large, a few huge
// (which fail on a 4 GiB device), and now and then zero.
func soakSize(rng *rand.Rand) uint64 {
	switch r := rng.IntN(100); {
	case r < 2:
		return 0
	case r < 60:
		return uint64(1 + rng.IntN(1*mib))
	case r < 95:
		return uint64(1*mib + rng.IntN(40*mib))
	case r < 99:
		return uint64(64*mib + rng.IntN(512*mib))
	default:
		return uint64(1*gib + rng.IntN(8*gib))
	}
}

type soakBlock struct {
	p      device.Ptr
	stream device.Stream
}

// soakLength returns the length of a soak: full with -soak, short under
// the self-checks (which check every structure at every operation), plain
// otherwise.
func soakLength(plain, full, selfChecked int) int {
	switch {
	case *soak:
		return full
	case selfChecks:
		return selfChecked
	}
	return plain
}

// TestSoak runs random operations against one allocator on a 4 GiB
// simulated device with four streams, two of them holding their work until
// the run lets it finish: allocations of every size (out of memory is an
// allowed outcome), frees, record-stream on other streams, stream and
// device synchronizations, and cache emptying. Every other error fails the
// soak. The invariant checker runs every 10,000 operations and at the end,
// when everything is freed, the device synchronized and the cache emptied:
// then the allocator must hold nothing and the device must have no memory
// in use, no reservation and no event.
func TestSoak(t *testing.T) {
	ops := soakLength(100_000, 10_000_000, 5_000)
	if *soakOps > 0 {
		ops = *soakOps
	}
	for i, sc := range soakConfigs {
		t.Run(sc.name, func(t *testing.T) {
			n := ops
			if !*soak && *soakOps == 0 && i > 0 {
				n = ops / 2 // the short run spends most on the default
			}
			runSoak(t, sc.conf, uint64(i+1), n)
		})
	}
}

func runSoak(t *testing.T, conf string, seed uint64, ops int) {
	cfg, err := allocator.ParseConf(conf)
	require.NoError(t, err)
	dev := simtest.New(t, simtest.Capacity(4*gib), freeCalls)
	a := gpumemtest.NewOn(t, dev, gpumemtest.WithConfig(cfg))
	streams := simtest.Streams(t, dev, 3)
	for _, s := range streams[1:3] {
		require.NoError(t, dev.SetStreamBusy(s, true))
	}
	rng := rand.New(rand.NewPCG(seed, 0x50a4))
	var live []soakBlock
	var ooms, allocs int
	check := func(at int) {
		if err := a.CheckInvariants(); err != nil {
			t.Fatalf("after op %d: %v", at, err)
		}
	}
	for i := range ops {
		switch r := rng.IntN(1000); {
		case r < 470 || len(live) == 0:
			s := streams[rng.IntN(len(streams))]
			p, err := a.Alloc(soakSize(rng), s)
			allocs++
			switch {
			case errors.Is(err, device.ErrOutOfMemory):
				ooms++
			case err != nil:
				t.Fatalf("op %d: Alloc: %v", i, err)
			default:
				live = append(live, soakBlock{p, s})
			}
		case r < 920:
			j := rng.IntN(len(live))
			if err := a.Free(live[j].p); err != nil {
				t.Fatalf("op %d: Free: %v", i, err)
			}
			live[j] = live[len(live)-1]
			live = live[:len(live)-1]
		case r < 970:
			b := live[rng.IntN(len(live))]
			if b.p == 0 {
				break // a zero-byte allocation has no block to record
			}
			if err := a.RecordStream(b.p, streams[rng.IntN(len(streams))]); err != nil {
				t.Fatalf("op %d: RecordStream: %v", i, err)
			}
		case r < 990:
			if err := dev.SynchronizeStream(streams[rng.IntN(len(streams))]); err != nil {
				t.Fatalf("op %d: SynchronizeStream: %v", i, err)
			}
		case r < 996:
			if err := dev.Synchronize(); err != nil {
				t.Fatalf("op %d: Synchronize: %v", i, err)
			}
		default:
			if err := a.EmptyCache(); err != nil {
				t.Fatalf("op %d: EmptyCache: %v", i, err)
			}
		}
		if i%10_000 == 9_999 {
			check(i)
		}
		// Keep the live set near a steady size, as a training loop does.
		for len(live) > 2000 {
			if err := a.Free(live[len(live)-1].p); err != nil {
				t.Fatalf("op %d: Free: %v", i, err)
			}
			live = live[:len(live)-1]
		}
	}
	check(ops)
	for _, b := range live {
		require.NoError(t, a.Free(b.p))
	}
	require.NoError(t, dev.Synchronize())
	require.NoError(t, a.EmptyCache())
	check(ops)
	st := a.Stats()
	require.Zero(t, st.AllocatedBytes[0].Current, "allocated bytes after freeing everything")
	require.Zero(t, st.ReservedBytes[0].Current, "reserved bytes after EmptyCache")
	require.Zero(t, st.Allocation[0].Current)
	require.Zero(t, st.Segment[0].Current)
	require.Zero(t, dev.BytesInUse(), "device memory in use")
	require.Empty(t, dev.Reservations(), "address reservations")
	c := dev.Counters()
	require.Equal(t, c.EventsRecorded, c.EventsReleased, "every event released")
	require.Positive(t, ooms, "the soak reaches out of memory")
	t.Logf("%d ops (%d allocations, %d out of memory), %d device mallocs, peak reserved %d MiB",
		ops, allocs, ooms, c.Mallocs, st.ReservedBytes[0].Peak/mib)
}

// TestSoakManager runs 8 goroutines against a Manager of 2 simulated
// devices with 4 streams each (run it with -race): each goroutine
// allocates on any device and stream, frees its own blocks, records them
// on other streams of their device, and now and then reads stats and the
// summary, empties the caches or checks an allocator's invariants. At the
// end every block is freed and the caches emptied: nothing must be left.
func TestSoakManager(t *testing.T) {
	perWorker := soakLength(20_000, 1_000_000, 500)
	const workers, devices, streamsPer = 8, 2, 4
	devs := make([]*sim.Device, devices)
	m, err := allocator.NewManager(func(o int) (device.Device, error) {
		if o >= devices {
			return nil, fmt.Errorf("no device %d", o)
		}
		return devs[o], nil
	}, allocator.Config{MaxSplitSize: 128 * mib})
	require.NoError(t, err)
	streams := make([][]device.Stream, devices)
	for o := range devices {
		devs[o] = simtest.New(t, simtest.Ordinal(o), simtest.Capacity(2*gib), freeCalls)
		streams[o] = []device.Stream{device.DefaultStream}
		for range streamsPer - 1 {
			s, err := devs[o].NewStream()
			require.NoError(t, err)
			streams[o] = append(streams[o], s)
		}
	}
	type owned struct {
		dev int
		p   device.Ptr
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fail := func(err error) { errs <- fmt.Errorf("worker %d: %w", w, err) }
			rng := rand.New(rand.NewPCG(uint64(w), 0x3a6e))
			var live []owned
			for i := range perWorker {
				switch r := rng.IntN(100); {
				case r < 48 || len(live) == 0:
					o := rng.IntN(devices)
					p, err := m.Alloc(o, soakSize(rng)/4, streams[o][rng.IntN(streamsPer)])
					if err != nil && !errors.Is(err, device.ErrOutOfMemory) {
						fail(err)
						return
					}
					if err == nil {
						live = append(live, owned{o, p})
					}
				case r < 93:
					j := rng.IntN(len(live))
					if err := m.Free(live[j].dev, live[j].p); err != nil {
						fail(err)
						return
					}
					live[j] = live[len(live)-1]
					live = live[:len(live)-1]
				case r < 98:
					b := live[rng.IntN(len(live))]
					if b.p == 0 {
						break // a zero-byte allocation has no block to record
					}
					if err := m.RecordStream(b.dev, b.p, streams[b.dev][rng.IntN(streamsPer)]); err != nil {
						fail(err)
						return
					}
				default:
					switch i % 4 {
					case 0:
						_ = m.TotalStats().Map()
					case 1:
						if _, err := m.Summary(rng.IntN(devices), true); err != nil {
							fail(err)
							return
						}
					case 2:
						if err := m.EmptyCache(); err != nil {
							fail(err)
							return
						}
					case 3:
						a, err := m.Allocator(rng.IntN(devices))
						if err == nil {
							err = a.CheckInvariants()
						}
						if err != nil {
							fail(err)
							return
						}
					}
				}
				for len(live) > 200 {
					b := live[len(live)-1]
					if err := m.Free(b.dev, b.p); err != nil {
						fail(err)
						return
					}
					live = live[:len(live)-1]
				}
			}
			for _, b := range live {
				if err := m.Free(b.dev, b.p); err != nil {
					fail(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for o := range devices {
		require.NoError(t, devs[o].Synchronize())
	}
	require.NoError(t, m.EmptyCache())
	for o := range devices {
		a, err := m.Allocator(o)
		require.NoError(t, err)
		require.NoError(t, a.CheckInvariants())
		st := m.Stats(o)
		require.Zero(t, st.AllocatedBytes[0].Current, "device %d: allocated bytes", o)
		require.Zero(t, st.ReservedBytes[0].Current, "device %d: reserved bytes", o)
		require.Zero(t, devs[o].BytesInUse(), "device %d: memory in use", o)
		c := devs[o].Counters()
		require.Equal(t, c.EventsRecorded, c.EventsReleased, "device %d: every event released", o)
	}
}
