package estimate_test

import (
	"fmt"

	"github.com/gpumem/gpumem/estimate"
)

// The guide's arithmetic, then a question about a real model on a real
// card.
func Example() {
	// Mixed-precision AdamW keeps 16 bytes per parameter before activations.
	r, err := estimate.Plan{
		Params:   7e9,
		Workload: estimate.Workload{Precision: estimate.AMPBF16, Optimizer: estimate.AdamW},
		Capacity: 80 << 30,
	}.Estimate()
	if err != nil {
		panic(err)
	}
	b := r.Breakdown
	fmt.Printf("7B, amp-bf16 AdamW: %d GB of parameter state; fits 80 GiB: %v\n", (b.Weights+b.Gradients+b.Optimizer)/1e9, r.Fits)

	// QLoRA fine-tuning of Llama-2-7B on a 24 GB card.
	m, _ := estimate.Preset("llama-7b")
	card, _ := estimate.LookupCard("rtx4090-24g")
	pl := estimate.Plan{Model: &m, Workload: estimate.Workload{Mode: estimate.QLoRA, Batch: 2, Seq: 1024}, Capacity: card.Memory}
	r, err = pl.Estimate()
	if err != nil {
		panic(err)
	}
	n, _ := pl.MaxBatch(256)
	fmt.Printf("llama-7b QLoRA, batch 2 × 1024 on %s: fits %v; largest batch %d\n", card.Name, r.Fits, n)

	// Full training does not fit; the ladder of remedies lists what would,
	// each with what it needs.
	pl.Workload.Mode = estimate.Full
	rs, _ := pl.Remedies()
	for _, x := range rs {
		fmt.Println(x)
	}
	// Output:
	// 7B, amp-bf16 AdamW: 112 GB of parameter state; fits 80 GiB: false
	// llama-7b QLoRA, batch 2 × 1024 on rtx4090-24g: fits true; largest batch 3
	// QLoRA (4-bit base, LoRA adapters) (--mode qlora --precision amp-bf16): needs 17.03 GiB
}
