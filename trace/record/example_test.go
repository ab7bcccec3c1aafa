// Runnable examples of the record package.

package record_test

import (
	"bytes"
	"fmt"
	"os"
	"strings"

	"github.com/google/pprof/profile"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/record"
)

// Record what a program asks of an allocator as memtrace, to replay it
// later. The program writes the tag and the step mark itself; the
// allocations, frees and the cache flush come from the allocator.
func ExampleRecorder() {
	dev, _ := sim.New(sim.Config{})
	a, _ := allocator.New(dev, allocator.Config{})

	w := trace.NewWriter(os.Stdout, "source=example")
	rec := record.New(w, record.Options{})
	detach := a.Attach(rec)

	rec.Mark("step0")
	rec.Tag("forward")
	x, _ := a.Alloc(1<<20, device.DefaultStream)
	y, _ := a.Alloc(4096, device.DefaultStream)
	a.Free(x)
	a.Free(y)
	a.EmptyCache()

	detach()
	if err := rec.Flush(); err != nil {
		fmt.Println(err)
	}
	// Output:
	// # memtrace v1 source=example
	// m step0
	// t forward
	// a 0 1048576 0
	// a 1 4096 0
	// f 0
	// f 1
	// c
}

// loadWeights and loadActivations stand for the Go code that allocates
// device memory; the profile attributes live memory to them.
func loadWeights(a *allocator.Allocator) {
	for range 3 {
		a.Alloc(4<<20, device.DefaultStream)
	}
}

func loadActivations(a *allocator.Allocator) device.Ptr {
	p, _ := a.Alloc(1<<20, device.DefaultStream)
	return p
}

// With Options.Stacks the Recorder keeps the Go call stack of every live
// allocation, and WriteProfile writes them as a pprof profile of live
// device memory: `go tool pprof -top -sample_index=bytes FILE` lists the
// Go functions that hold device memory. Here the profile is read back
// with github.com/google/pprof/profile.
func ExampleRecorder_WriteProfile() {
	dev, _ := sim.New(sim.Config{})
	a, _ := allocator.New(dev, allocator.Config{})
	var memtrace bytes.Buffer
	rec := record.New(trace.NewWriter(&memtrace), record.Options{Stacks: true})
	defer a.Attach(rec)()

	loadWeights(a)
	act := loadActivations(a)
	a.Free(act) // freed: no longer in the profile

	var out bytes.Buffer
	if err := rec.WriteProfile(&out); err != nil {
		fmt.Println(err)
		return
	}
	p, err := profile.Parse(&out)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, s := range p.Sample {
		for _, loc := range s.Location {
			for _, l := range loc.Line {
				if name := l.Function.Name; strings.HasPrefix(name, "github.com/gpumem/gpumem/trace/record_test.load") {
					fmt.Printf("%s: %d blocks, %d bytes\n", strings.TrimPrefix(name, "github.com/gpumem/gpumem/trace/record_test."), s.Value[0], s.Value[1])
				}
			}
		}
	}
	// Output:
	// loadWeights: 3 blocks, 12582912 bytes
}
