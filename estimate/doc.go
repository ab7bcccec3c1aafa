// Package estimate answers the first question of GPU memory planning: will
// this model fit on this card, and if not, what should change?
//
// It answers the way the PyTorch memory guide teaches, by arithmetic
// (parameters, gradients, optimizer state, activations, key/value cache,
// per-process overhead), and checks the arithmetic by simulation: the run's
// allocations, tensor by tensor, are served by gpumem's caching allocator
// on a simulated device of the card's size, so that rounding, caching and
// fragmentation count as PyTorch's allocator would count them.
//
//	m, _ := estimate.Preset("llama-7b")
//	card, _ := estimate.LookupCard("a100-80g")
//	r, err := estimate.Plan{
//		Model:    &m,
//		Workload: estimate.Workload{Mode: estimate.QLoRA, Batch: 4, Seq: 1024},
//		Capacity: card.Memory,
//	}.Estimate()
//	fmt.Println(r.Fits, estimate.FormatBytes(r.Sim.PeakReserved))
//
// # The pieces
//
//   - Model: a transformer's architecture, from a preset (Preset), a Hugging
//     Face config.json (ParseConfig) or dimensions (Generic); or, in a Plan,
//     only a parameter count, which gives the parameter state but no
//     activations.
//   - Workload: full training, LoRA, QLoRA or inference; the precision; the
//     optimizer and its implementation; batch and sequence; checkpointing;
//     eager or flash attention; sharding over GPUs (ZeRO-1/2/3, FSDP) and
//     offload to host memory.
//   - Plan: a model, a workload, one GPU's memory, the per-process context
//     and the allocator's configuration. Plan.Estimate counts and simulates,
//     and finds what the plan needs (Result.MinCapacity: the smallest
//     capacity on which the simulated run has no out-of-memory error, as
//     trace/plan's Fit finds a trace's); Plan.MaxBatch and Plan.MaxSeq
//     search what fits; Plan.Remedies lists the changes that make it fit,
//     cheapest first, ending with the cheapest combination.
//   - Card: the named accelerators (LookupCard).
//
// # How the run is modelled
//
// The model code is written as Hugging Face transformers writes it (GPT-2,
// BERT and Llama families), operation by operation, over a small emulation
// of autograd (the tape): every operation allocates its output, and keeps
// for backward what its autograd formula keeps (a linear layer its input
// when its weight trains, layer norm its input and statistics, softmax its
// output, dropout its mask); a tensor is freed when the program no longer
// references it and nothing keeps it. Backward walks the recorded
// operations in reverse, allocating each input's gradient and each
// parameter's, and releasing what each operation kept. A training step is
// forward, loss, backward, optimizer step and zero_grad; two steps are run,
// so that the second sees the optimizer state the first created. Inference
// is the prefill of batch × seq tokens followed by decoding, with the
// key/value cache; a generation longer than 1,536 tokens simulates its
// first and last 512 steps and 512 evenly spaced steps between, each
// growing the cache by the tokens it stands for, so that its cost does
// not grow with its length. The model is never listed whole: the stream
// is generated layer by layer, and what stays in memory is what a real
// run keeps, besides the stream's own recording (8 bytes an operation, up
// to 16 Mi of them).
//
// The same stream feeds two sinks: a counter, which gives the breakdown
// (each category's high-water mark, and the high-water mark of their sum),
// and the caching allocator, which gives the simulated peaks and whether
// every allocation succeeded. The counter also records the stream, which
// the search for the smallest capacity replays, capacity after capacity,
// without running the program again. The formulas behind each term, and
// where each number comes from, are in FORMULAS.md beside this file.
//
// # Accuracy
//
// The tests compare the simulated peak allocated with eager PyTorch runs:
// a 12-layer Llama-shaped language model's forward and backward (the
// CS336 transformer, a trace of a GPU run) and a BERT-base encoder's
// training at batch 2, 4 and 8 (traces captured from PyTorch 1.13, whose
// foreach AdamW step kept two parameter-sized lists: OptimizerImpl
// Foreach113), each configured as the run was; all land within 2%. A
// third test holds GPT-2 small's training at batch 4 × 512 near one
// figure, 5.44 GiB, the peak of live bytes of a PyTorch 1.13 capture of a
// GPT-2-small built from torch.nn.TransformerEncoderLayer (eager
// attention, dropout 0.1, foreach AdamW): another program than the
// Hugging Face GPT-2 the preset models, which gives 5.18 GiB (−4.7%) with
// its default attention and 6.44 GiB (+18.5%) with eager attention.
// Where an implementation differs from the one modelled (another attention
// kernel, a different loss, a framework that keeps other tensors), so does
// its memory: the Model and Workload fields name the choices that matter.
//
// # Limits
//
// Models are refused beyond MaxLayers, MaxHidden, MaxHeads and MaxVocab,
// workloads beyond MaxBatch and MaxSequence, bare counts beyond
// MaxParameters. Within the limits every size is computed with saturating
// arithmetic: an absurd shape is a size that does not fit, never an
// overflow, and the simulation stops at its first failed allocation.
package estimate
