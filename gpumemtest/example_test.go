package gpumemtest_test

import (
	"fmt"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/gpumemtest"
)

// exampleT stands in for a test's *testing.T in these examples: it prints
// what the test would report, and runs the cleanups when the test ends.
type exampleT struct{ cleanups []func() }

func (t *exampleT) Helper()                           {}
func (t *exampleT) Errorf(format string, args ...any) { fmt.Printf("FAIL: "+format+"\n", args...) }
func (t *exampleT) Fatalf(format string, args ...any) { fmt.Printf("FATAL: "+format+"\n", args...) }
func (t *exampleT) Cleanup(f func())                  { t.cleanups = append(t.cleanups, f) }

func (t *exampleT) end() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}

// runTest runs a test function as go test would, its cleanups after it.
func runTest(test func(t gpumemtest.TB)) {
	t := &exampleT{}
	test(t)
	t.end()
}

// A test builds its allocator on a simulated device; when the test ends,
// the fixture fails it for the memory left allocated.
func Example() {
	runTest(func(t gpumemtest.TB) {
		a := gpumemtest.New(t, gpumemtest.WithCapacity(16<<30))
		a.SetPhase("forward")
		activations, _ := a.Alloc(6<<20, device.DefaultStream)
		logits, _ := a.Alloc(1000, device.DefaultStream)
		_ = a.Free(activations)
		_ = logits // forgotten
	})
	// Output:
	// FAIL: gpumemtest: device 0: 1 block (1024 bytes) still allocated:
	// 	0x100001400000 1024 bytes (requested 1000 bytes) small_pool, stream 0
	// 	allocated by phase: "forward" 1024 bytes
}

// A test of code that shares an allocator with long-lived state checks
// only what it allocates itself.
func ExampleVerifyNoLeaks() {
	dev, _ := sim.New(sim.Config{})
	a, _ := allocator.New(dev, allocator.Config{})
	weights, _ := a.Alloc(64<<20, device.DefaultStream) // state kept by the program
	defer func() { _ = a.Free(weights) }()

	runTest(func(t gpumemtest.TB) {
		defer gpumemtest.VerifyNoLeaks(t, a, gpumemtest.IgnoreCurrent(a))
		buf, _ := a.Alloc(4<<20, device.DefaultStream)
		_ = a.Free(buf)
	})
	fmt.Println("clean test: nothing reported")
	// Output:
	// clean test: nothing reported
}

// A fragmentation test: 3 MiB blocks come from 20 MiB segments, so ten
// of them need 40 MiB of device memory for 30 MiB asked.
func ExampleVerifyBudget() {
	runTest(func(t gpumemtest.TB) {
		a := gpumemtest.New(t, gpumemtest.WithConfig(allocator.Config{})) // PyTorch's defaults
		var blocks []device.Ptr
		for range 10 {
			p, _ := a.Alloc(3<<20, device.DefaultStream)
			blocks = append(blocks, p)
		}
		for _, p := range blocks {
			_ = a.Free(p)
		}
		fmt.Printf("fragmentation %.3f\n", gpumemtest.Fragmentation(a.Stats()))
		gpumemtest.VerifyBudget(t, a, gpumemtest.Budget{MaxReserved: 64 << 20, MaxFragmentation: 1.25})
	})
	// Output:
	// fragmentation 1.333
	// FAIL: gpumemtest: device 0: fragmentation 1.333 is over the budget of 1.250 (peak reserved 40.00 MiB, peak allocated 30.00 MiB, peak requested 30.00 MiB; fragmentation = peak reserved / peak requested = 1.333)
}
