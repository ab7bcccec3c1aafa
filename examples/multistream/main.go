// Command multistream shows why an allocator must know about streams: a
// buffer used by a copy on a side stream is freed on the compute stream,
// and gpumem keeps it out of reuse until the copy's work has finished.
//
//	go run ./examples/multistream
package main

import (
	"fmt"
	"log"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
)

func main() {
	dev, err := sim.New(sim.Config{})
	if err != nil {
		log.Fatal(err)
	}
	a, err := allocator.New(dev, allocator.Config{})
	if err != nil {
		log.Fatal(err)
	}
	copyStream, err := dev.NewStream()
	if err != nil {
		log.Fatal(err)
	}
	// On the simulated device the test decides when work finishes: hold
	// the copy stream busy, as a long transfer would.
	if err := dev.SetStreamBusy(copyStream, true); err != nil {
		log.Fatal(err)
	}

	buf, _ := a.Alloc(64<<20, device.DefaultStream)
	// ... a copy kernel on copyStream reads buf ...
	if err := a.RecordStream(buf, copyStream); err != nil {
		log.Fatal(err)
	}
	if err := a.Free(buf); err != nil {
		log.Fatal(err)
	}
	st := a.Stats()
	fmt.Printf("after free: allocated %d MiB, active %d MiB (pending the copy)\n",
		st.Allocated()>>20, st.ActiveBytes[0].Current>>20)

	next, _ := a.Alloc(64<<20, device.DefaultStream)
	fmt.Println("reused while the copy runs:", next == buf)

	if err := dev.CompleteStream(copyStream); err != nil { // the copy finishes
		log.Fatal(err)
	}
	again, _ := a.Alloc(64<<20, device.DefaultStream)
	fmt.Println("reused after the copy:", again == buf)
}
