// Runnable examples of the replay package.

package replay_test

import (
	"fmt"
	"strings"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/stats"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/replay"
)

// Replay a short trace through the caching allocator on a simulated
// device. The second step reuses the cached blocks of the first: no new
// device allocation.
func ExampleRun() {
	const text = `# memtrace v1 two steps
a 0 3000000
a 1 512
f 0
f 1
a 2 3000000
a 3 512
f 2
f 3
`
	r, err := trace.NewReader(strings.NewReader(text))
	if err != nil {
		fmt.Println(err)
		return
	}
	dev, err := sim.New(sim.Config{Capacity: 1 << 30})
	if err != nil {
		fmt.Println(err)
		return
	}
	a, err := allocator.New(dev, allocator.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := replay.Run(r, a, dev, replay.Options{Name: "two steps"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s: %d ops, %d allocations, %d out of memory\n", res.Trace, res.Ops, res.Alloc, res.OOMs)
	fmt.Printf("peak requested %d, peak reserved %d\n", res.PeakRequested, res.PeakReserved)
	fmt.Printf("device allocations %d, fragmentation %.2f\n", res.DeviceAllocs, res.Fragmentation)
	// Output:
	// two steps: 8 ops, 4 allocations, 0 out of memory
	// peak requested 3000512, peak reserved 23068672
	// device allocations 2, fragmentation 7.69
}

// Options.Mark reads the allocator at each step boundary: here, the
// memory still allocated when each step begins, the first thing to look
// at for a leak.
func ExampleOptions_mark() {
	const text = `m step0
a 0 1048576
a 1 4096
f 0
m step1
a 2 1048576
f 2
m step2
`
	dev, _ := sim.New(sim.Config{})
	a, _ := allocator.New(dev, allocator.Config{})
	opt := replay.Options{Mark: func(name string) {
		st := a.Stats()
		fmt.Printf("%s: %d bytes allocated\n", name, st.AllocatedBytes[stats.All].Current)
	}}
	r, err := trace.NewReader(strings.NewReader(text))
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := replay.Run(r, a, dev, opt); err != nil {
		fmt.Println(err)
	}
	// Output:
	// step0: 0 bytes allocated
	// step1: 4096 bytes allocated
	// step2: 4096 bytes allocated
}
