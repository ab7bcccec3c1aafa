// Runnable examples of the viz package.

package viz_test

import (
	"fmt"
	"io"
	"strings"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/replay"
	"github.com/gpumem/gpumem/trace/viz"
)

// Draw a replay: the timeline of memory and the segments at the peak of
// reserved memory, as SVG (to a file, in a real program).
func ExampleReplay() {
	const text = `a 0 3000000
a 1 30000000
f 0
a 2 512
f 1
f 2
`
	r, err := trace.NewReader(strings.NewReader(text))
	if err != nil {
		fmt.Println(err)
		return
	}
	dev, _ := sim.New(sim.Config{})
	a, _ := allocator.New(dev, allocator.Config{})
	pic, res, err := viz.Replay(r, a, replay.Options{Name: "example", Batch: 1})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%d samples; peak reserved %d after op %d, in %d segments\n",
		len(pic.Samples), res.PeakReserved, pic.PeakOp, len(pic.Peak))
	if err := pic.WriteSVG(io.Discard); err != nil {
		fmt.Println(err)
	}
	// Output:
	// 6 samples; peak reserved 54525952 after op 4, in 3 segments
}
