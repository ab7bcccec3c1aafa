// Runnable examples of the convert package.

package convert_test

import (
	"fmt"
	"os"
	"strings"

	"github.com/gpumem/gpumem/trace/convert"
)

func ExampleConvert() {
	// An RMM log whose second row frees a block allocated before the log began.
	const log = `Thread,Time,Action,Pointer,Size,Stream
1,12:00:00.000001,allocate,0x7f0000000000,1024,0x0
1,12:00:00.000002,free,0x7effff000000,256,0x0
1,12:00:00.000003,free,0x7f0000000000,1024,0x0
`
	format, err := convert.Convert(os.Stdout, strings.NewReader(log), "rmm.csv", convert.Options{})
	if err != nil {
		fmt.Println(err)
	}
	fmt.Println("# read as", format)
	// Output:
	// # memtrace v1 source=rmm.csv format=rmm-csv
	// # capture: RMM logging_resource_adaptor CSV (3 rows); allocate->a, free->f; 1 blocks freed in the log but allocated before it, allocated up front; 0 blocks alive at the end freed after the log
	// # stats: ops=4 allocs=2 peak_live_bytes=1280 streams=1
	// a 0 256 0
	// # history window starts
	// a 1 1024 0
	// f 0
	// f 1
	// # read as rmm-csv
}
