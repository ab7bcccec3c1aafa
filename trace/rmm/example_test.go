// Runnable examples of the rmm package.

package rmm_test

import (
	"fmt"
	"strings"

	"github.com/gpumem/gpumem/trace/rmm"
)

// Import the CSV log of RMM's logging_resource_adaptor. The log began
// after the block at 0x7f5000 was allocated, so that block is allocated up
// front; the failed allocation has no op; the block still live at the end
// is freed after the log. The second stream handle becomes stream 1.
func ExampleReadLog() {
	const log = `Thread,Time,Action,Pointer,Size,Stream
140,08:00:00.000001,allocate,0x7f6000,1024,0x0
140,08:00:00.000002,free,0x7f5000,512,0x0
140,08:00:00.000003,allocate failure,(nil),1099511627776,0x0
140,08:00:00.000004,allocate,0x7f7000,2048,0x55aa00
140,08:00:00.000005,free,0x7f6000,1024,0x0
`
	im, err := rmm.ReadLog(strings.NewReader(log))
	if err != nil {
		fmt.Println(err)
		return
	}
	for i, op := range im.Ops {
		switch i {
		case im.WindowStart:
			fmt.Println("-- the log")
		case im.WindowEnd:
			fmt.Println("-- alive at the end")
		}
		fmt.Println(op)
	}
	fmt.Println(im.Ignored)
	// Output:
	// a 0 512 0
	// -- the log
	// a 1 1024 0
	// f 0
	// a 2 2048 1
	// f 1
	// -- alive at the end
	// f 2
	// map[allocate failure:1]
}
