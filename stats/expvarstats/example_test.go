package expvarstats_test

import (
	"encoding/json"
	"expvar"
	"fmt"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/stats/expvarstats"
)

// An allocator publishes its stats at /debug/vars with one call.
func ExamplePublish() {
	dev, _ := sim.New(sim.Config{})
	a, _ := allocator.New(dev, allocator.Config{})
	if err := expvarstats.Publish("gpumem_device0", a); err != nil {
		panic(err)
	}
	_, _ = a.Alloc(1<<20, device.DefaultStream)
	var m map[string]int64
	_ = json.Unmarshal([]byte(expvar.Get("gpumem_device0").String()), &m)
	fmt.Println(m["allocated_bytes.all.current"], m["segment.all.current"])
	// Output:
	// 1048576 1
}
