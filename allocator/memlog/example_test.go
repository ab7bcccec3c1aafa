package memlog_test

import (
	"log/slog"
	"os"
	"strconv"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/allocator/memlog"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
)

// A training loop logs its memory every two steps, and its new peaks with
// the phase that reached them.
func Example() {
	dev, _ := sim.New(sim.Config{})
	a, _ := allocator.New(dev, allocator.Config{})
	// Timestamps and the byte counts (the group "memory", for machines)
	// left out, for a short output.
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, attr slog.Attr) slog.Attr {
			if len(groups) == 0 && attr.Key == slog.TimeKey || len(groups) > 0 && groups[0] == "memory" {
				return slog.Attr{}
			}
			return attr
		},
	}))

	rep, _ := memlog.New(a, logger, memlog.Options{Every: 2})
	defer rep.Close()

	weights, _ := a.Alloc(40<<20, device.DefaultStream)
	for i := range 4 {
		rep.Step(strconv.Itoa(i)) // marks the step, then logs what is due
		a.SetPhase("forward")
		act, _ := a.Alloc(24<<20, device.DefaultStream)
		a.SetPhase("backward")
		grad, _ := a.Alloc(40<<20, device.DefaultStream)
		_ = a.Free(act)
		a.SetPhase("optimizer")
		_ = a.Free(grad)
	}
	_ = a.Free(weights)
	// Output:
	// level=INFO msg="gpu memory peak" device=0 stat=allocated_bytes.all.peak peak=41943040 phase="" step="" line="allocated 40.00 MiB (peak 40.00 MiB) | reserved 40.00 MiB (peak 40.00 MiB)"
	// level=INFO msg="gpu memory peak" device=0 stat=reserved_bytes.all.peak peak=41943040 phase="" step="" line="allocated 40.00 MiB (peak 40.00 MiB) | reserved 40.00 MiB (peak 40.00 MiB)"
	// level=INFO msg="gpu memory" device=0 step=1 steps=2 phase=optimizer line="allocated 40.00 MiB (peak 104.00 MiB) | reserved 104.00 MiB (peak 104.00 MiB)"
	// level=INFO msg="gpu memory peak" device=0 stat=allocated_bytes.all.peak peak=109051904 phase=backward step=0 line="allocated 40.00 MiB (peak 104.00 MiB) | reserved 104.00 MiB (peak 104.00 MiB)"
	// level=INFO msg="gpu memory peak" device=0 stat=reserved_bytes.all.peak peak=109051904 phase=backward step=0 line="allocated 40.00 MiB (peak 104.00 MiB) | reserved 104.00 MiB (peak 104.00 MiB)"
	// level=INFO msg="gpu memory" device=0 step=3 steps=4 phase=optimizer line="allocated 40.00 MiB (peak 104.00 MiB) | reserved 104.00 MiB (peak 104.00 MiB)"
}
