// Command training shows gpumem under a framework's tensor allocations: a
// few steps of a small model's forward and backward passes on the
// simulated device, printing memory after each step, then the summary.
//
//	go run ./examples/training
package main

import (
	"fmt"
	"log"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/stats"
)

func main() {
	dev, err := sim.New(sim.Config{Capacity: 16 << 30})
	if err != nil {
		log.Fatal(err)
	}
	cfg, err := allocator.ConfigFromEnv() // GPUMEM_ALLOC_CONF, else PYTORCH_ALLOC_CONF, else PYTORCH_CUDA_ALLOC_CONF
	if err != nil {
		log.Fatal(err)
	}
	a, err := allocator.New(dev, cfg)
	if err != nil {
		log.Fatal(err)
	}

	const layers, batch, width = 8, 64, 4096
	alloc := func(n uint64) device.Ptr {
		p, err := a.Alloc(n, device.DefaultStream)
		if err != nil {
			log.Fatal(err) // an *allocator.OutOfMemoryError says what to try
		}
		return p
	}
	weights := make([]device.Ptr, layers)
	for i := range weights {
		weights[i] = alloc(width * width * 4)
	}
	for step := 1; step <= 4; step++ {
		acts := make([]device.Ptr, layers)
		for i := range acts { // forward: keep each layer's output
			acts[i] = alloc(batch * width * 4)
		}
		grads := make([]device.Ptr, layers)
		for i := layers - 1; i >= 0; i-- { // backward
			grads[i] = alloc(width * width * 4)
			tmp := alloc(batch * width * 4)
			must(a.Free(tmp))
			must(a.Free(acts[i]))
		}
		for _, g := range grads { // optimizer step, then zero_grad
			must(a.Free(g))
		}
		st := a.Stats()
		fmt.Printf("step %d: %s, device mallocs so far %d\n", step, stats.Line(&st), st.NumDeviceAlloc)
	}
	fmt.Print(a.Summary(true))
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
