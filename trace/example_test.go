// Runnable examples of the trace package.

package trace_test

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/gpumem/gpumem/trace"
)

func ExampleReader() {
	const text = `# memtrace v1 example
# mark step0
a 0 1048576 0
t backward
a 1 512 1
r 0 1
f 1
s 1
f 0
`
	rd, err := trace.NewReader(strings.NewReader(text))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("header:", rd.Header())
	for {
		op, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("line %d: %-8s %v\n", rd.Line(), op.Kind, op)
	}
	// Output:
	// header: [memtrace v1 example]
	// line 2: mark     m step0
	// line 3: alloc    a 0 1048576 0
	// line 4: tag      t backward
	// line 5: alloc    a 1 512 1
	// line 6: record-stream r 0 1
	// line 7: free     f 1
	// line 8: sync-stream s 1
	// line 9: free     f 0
}

func ExampleReader_syntaxError() {
	_, err := trace.ReadAll(strings.NewReader("a 0 512\na 1 -5\n"))
	fmt.Println(err)
	// Output:
	// memtrace line 2: "a 1 -5": size is not a non-negative integer
}

func ExampleWriter() {
	w := trace.NewWriter(os.Stdout, "source=example", "two blocks")
	w.Write(trace.Op{Kind: trace.Mark, Name: "step0"})
	w.Write(trace.Op{Kind: trace.Alloc, ID: 0, Size: 4096})
	w.Write(trace.Op{Kind: trace.Alloc, ID: 1, Size: 512, Stream: 2})
	w.Write(trace.Op{Kind: trace.Free, ID: 0})
	w.Write(trace.Op{Kind: trace.EmptyCache})
	if err := w.Close(); err != nil {
		fmt.Println(err)
	}
	// Output:
	// # memtrace v1 source=example
	// # two blocks
	// m step0
	// a 0 4096 0
	// a 1 512 2
	// f 0
	// c
}

func ExampleValidator() {
	v := trace.NewValidator()
	ops := []trace.Op{
		{Kind: trace.Alloc, ID: 7, Size: 100},
		{Kind: trace.Free, ID: 7},
		{Kind: trace.Free, ID: 7},
	}
	for i, op := range ops {
		if _, err := v.Check(op, i+1); err != nil {
			fmt.Println(err)
		}
	}
	// Output:
	// memtrace line 3: "f 7": ID 7 is not live
}
