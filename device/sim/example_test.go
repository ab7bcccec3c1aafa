// Runnable examples of the simulated device.

package sim_test

import (
	"fmt"
	"time"

	"github.com/gpumem/gpumem/device/sim"
)

func Example() {
	dev, err := sim.New(sim.Config{Capacity: 1 << 30}) // 1 GiB, 2 MiB pages
	if err != nil {
		panic(err)
	}

	p, _ := dev.Malloc(3 << 20) // 3 MiB: charged as two pages
	free, total, _ := dev.MemInfo()
	fmt.Printf("allocated at %v; %d MiB free of %d MiB\n", p, free>>20, total>>20)

	_, err = dev.Malloc(2 << 30)
	fmt.Println(err)

	_ = dev.Free(p)
	free, _, _ = dev.MemInfo()
	fmt.Printf("after free: %d MiB free\n", free>>20)
	// Output:
	// allocated at 0x100000000000; 1020 MiB free of 1024 MiB
	// device 0: malloc: out of memory (2 GiB requested (2 GiB in pages), 1020 MiB free of 1 GiB)
	// after free: 1024 MiB free
}

// A busy stream holds its work: an event recorded on it stays pending until
// the test completes the stream (or something synchronizes it).
func ExampleDevice_SetStreamBusy() {
	dev, _ := sim.New(sim.Config{})
	s, _ := dev.NewStream()

	_ = dev.SetStreamBusy(s, true)
	e, _ := dev.RecordEvent(s)
	done, _ := dev.EventDone(e)
	fmt.Println("while busy:", done)

	_ = dev.CompleteStream(s)
	done, _ = dev.EventDone(e)
	fmt.Println("after CompleteStream:", done)

	_, err := dev.RecordEvent(42)
	fmt.Println(err)
	// Output:
	// while busy: false
	// after CompleteStream: true
	// device 0: record event: invalid stream (stream 0x2a is not a stream of device 0 (it has 2))
}

// Faults make the next allocation fail as a full card would.
func ExampleDevice_FailNthMalloc() {
	dev, _ := sim.New(sim.Config{})
	dev.FailNthMalloc(1)
	_, err := dev.Malloc(1 << 20)
	fmt.Println(err)
	fmt.Println("failed mallocs:", dev.Counters().FailedMallocs)
	// Output:
	// device 0: malloc: out of memory (1 MiB requested; injected fault: FailNthMalloc)
	// failed mallocs: 1
}

// The clock adds up what each call would cost on a real card.
func ExampleDevice_Clock() {
	dev, _ := sim.New(sim.Config{Costs: sim.Costs{
		Malloc:       30 * time.Microsecond,
		MallocPerGiB: -1, // a negative cost is free
		Free:         20 * time.Microsecond,
		Synchronize:  10 * time.Microsecond, // every Free implies one
	}})
	p, _ := dev.Malloc(1 << 20)
	_ = dev.Free(p)
	fmt.Println(dev.Clock())
	// Output:
	// 60µs
}
