package estimate_test

import (
	"fmt"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/estimate"
)

func ExampleSimulate() {
	m := estimate.Model{Layers: 12, Hidden: 768, Heads: 12, Vocab: 50257, Seq: 1024, Batch: 8, Bytes: 2, Optimizer: estimate.Adam}
	r, err := estimate.Simulate(m, 24<<30, allocator.Config{}, 2)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%.0fM parameters; fits on 24 GiB: %v\n", float64(m.Params())/1e6, r.Fits)
	// Output:
	// 124M parameters; fits on 24 GiB: true
}
