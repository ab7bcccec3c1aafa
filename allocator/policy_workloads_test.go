// Synthetic workloads for the traces the project does not hold: a
// multi-stream inference with per-layer weight offload, and a generation
// loop whose KV cache grows by one token per step. They are generated,
// not recorded: faithful in shape (the tensors a PyTorch program of that
// kind allocates, in that order, at those sizes), not in every detail.

package allocator_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/trace"
)

// opWriter builds a trace in memory.
type opWriter struct {
	ops  []trace.Op
	next uint64
}

func (w *opWriter) alloc(size, stream uint64) uint64 {
	id := w.next
	w.next++
	w.ops = append(w.ops, trace.Op{Kind: trace.Alloc, ID: id, Size: size, Stream: stream})
	return id
}

func (w *opWriter) free(ids ...uint64) {
	for _, id := range ids {
		w.ops = append(w.ops, trace.Op{Kind: trace.Free, ID: id})
	}
}

func (w *opWriter) record(id, stream uint64) {
	w.ops = append(w.ops, trace.Op{Kind: trace.RecordStream, ID: id, Stream: stream})
}

func (w *opWriter) sync(stream uint64) {
	w.ops = append(w.ops, trace.Op{Kind: trace.SyncStream, Stream: stream})
}

func (w *opWriter) mark(name string) { w.ops = append(w.ops, trace.Op{Kind: trace.Mark, Name: name}) }

// offloadOps is LLaMA-7B-shaped inference in fp16 (32 layers, d 4096,
// feed-forward 11008, 32 heads of 128, vocabulary 32000) with the layers'
// weights kept on the host and brought in per layer, depth layers ahead,
// on 9 copy streams (layer l on stream 1 + l mod 9): ten streams with the
// compute stream 0. The embedding, the head and a static KV cache per
// request stay on the device. For each of requests requests: a prefill of
// prompt tokens, then decode steps of one token. A layer's weights are
// allocated on their copy stream, recorded on stream 0 (record_stream)
// when compute uses them, and freed after the layer; the copy stream is
// synchronized when compute reaches the layer (its copy has finished by
// then). Activations follow the attention and the gated MLP of a layer.
func offloadOps(requests, decode, prompt, depth int) []trace.Op {
	const (
		d, ff, heads, hd, layers, vocab = 4096, 11008, 32, 128, 32, 32000
		h                               = 2 // bytes per fp16 value
	)
	w := &opWriter{}
	w.alloc(vocab*d*h, 0) // embedding
	w.alloc(vocab*d*h, 0) // head
	w.alloc(d*h, 0)       // final norm
	// Per layer: two norms, q, k, v, o, gate, up, down.
	weights := []uint64{d * h, d * h, d * d * h, d * d * h, d * d * h, d * d * h, ff * d * h, ff * d * h, ff * d * h}
	for r := range requests {
		var kv []uint64
		for range layers {
			n := uint64(heads * (prompt + decode) * hd * h)
			kv = append(kv, w.alloc(n, 0), w.alloc(n, 0))
		}
		for step := 0; step <= decode; step++ {
			w.mark(fmt.Sprintf("request%d_token%d", r, step))
			T := uint64(1)
			if step == 0 {
				T = uint64(prompt)
			}
			ctx := uint64(prompt + step)
			inflight := map[int][]uint64{}
			prefetch := func(l int) {
				if l < layers {
					for _, n := range weights {
						inflight[l] = append(inflight[l], w.alloc(n, uint64(1+l%9)))
					}
				}
			}
			for l := range depth {
				prefetch(l)
			}
			x := w.alloc(T*d*h, 0)
			for l := range layers {
				prefetch(l + depth)
				w.sync(uint64(1 + l%9))
				for _, id := range inflight[l] {
					w.record(id, 0)
				}
				n1 := w.alloc(T*d*h, 0)
				q, k, v := w.alloc(T*d*h, 0), w.alloc(T*d*h, 0), w.alloc(T*d*h, 0)
				scores := w.alloc(heads*T*ctx*h, 0)
				probs := w.alloc(heads*T*ctx*h, 0)
				w.free(scores)
				attn := w.alloc(T*d*h, 0)
				w.free(probs, q, k, v)
				o := w.alloc(T*d*h, 0)
				w.free(attn, n1)
				x2 := w.alloc(T*d*h, 0)
				w.free(o, x)
				n2 := w.alloc(T*d*h, 0)
				gate, up := w.alloc(T*ff*h, 0), w.alloc(T*ff*h, 0)
				w.free(n2)
				act := w.alloc(T*ff*h, 0)
				w.free(gate, up)
				down := w.alloc(T*d*h, 0)
				w.free(act)
				x = w.alloc(T*d*h, 0)
				w.free(down, x2)
				w.free(inflight[l]...)
				delete(inflight, l)
			}
			norm := w.alloc(T*d*h, 0)
			logits := w.alloc(T*vocab*4, 0)
			w.free(norm, x)
			token := w.alloc(8, 0)
			w.free(logits, token)
		}
		w.free(kv...)
	}
	return w.ops
}

// kvCacheOps is GPT-2-small-shaped generation in fp32 (12 layers, d 768,
// 12 heads of 64, feed-forward 3072, vocabulary 50257): the weights, then
// a prefill of prompt tokens and gen steps of one token, for a batch.
// Every step each layer concatenates its past keys and values with the
// new token's (torch.cat): a new, larger K and V per layer per step. With
// dynamic (Hugging Face's DynamicCache) a layer's old K and V are freed
// as soon as the new ones exist; without (the legacy tuple cache) the
// whole old cache is freed after the step, when its outputs replace it.
func kvCacheOps(batch, prompt, gen int, dynamic bool) []trace.Op {
	const (
		d, ff, heads, hd, layers, vocab, ctx = 768, 3072, 12, 64, 12, 50257, 1024
		f                                    = 4 // bytes per fp32 value
	)
	B := uint64(batch)
	w := &opWriter{}
	w.alloc(vocab*d*f, 0) // token embedding (tied head)
	w.alloc(ctx*d*f, 0)   // position embedding
	for range layers {
		for _, n := range []uint64{d, d, d * 3 * d, 3 * d, d * d, d, d, d, d * ff, ff, ff * d, d} {
			w.alloc(n*f, 0)
		}
	}
	w.alloc(d*f, 0)
	w.alloc(d*f, 0)
	past := make([][2]uint64, layers)
	for t := 0; t <= gen; t++ {
		w.mark(fmt.Sprintf("token%d", t))
		T := uint64(1)
		if t == 0 {
			T = uint64(prompt)
		}
		s := uint64(prompt + t) // the sequence after this step
		x := w.alloc(B*T*d*f, 0)
		var old []uint64
		for l := range layers {
			n1 := w.alloc(B*T*d*f, 0)
			qkv := w.alloc(B*T*3*d*f, 0)
			w.free(n1)
			k := w.alloc(B*heads*s*hd*f, 0) // torch.cat((past_k, k), dim=-2)
			v := w.alloc(B*heads*s*hd*f, 0)
			if t > 0 {
				if dynamic {
					w.free(past[l][0], past[l][1])
				} else {
					old = append(old, past[l][0], past[l][1])
				}
			}
			past[l] = [2]uint64{k, v}
			scores := w.alloc(B*heads*T*s*f, 0)
			probs := w.alloc(B*heads*T*s*f, 0)
			w.free(scores)
			attn := w.alloc(B*T*d*f, 0)
			w.free(probs, qkv)
			o := w.alloc(B*T*d*f, 0)
			w.free(attn)
			x2 := w.alloc(B*T*d*f, 0)
			w.free(o, x)
			n2 := w.alloc(B*T*d*f, 0)
			hidden := w.alloc(B*T*ff*f, 0)
			w.free(n2)
			act := w.alloc(B*T*ff*f, 0)
			w.free(hidden)
			m := w.alloc(B*T*d*f, 0)
			w.free(act)
			x = w.alloc(B*T*d*f, 0)
			w.free(m, x2)
		}
		norm := w.alloc(B*T*d*f, 0)
		w.free(x)
		logits := w.alloc(B*T*vocab*f, 0)
		w.free(norm)
		token := w.alloc(B*8, 0)
		w.free(logits, token)
		w.free(old...)
	}
	for _, kv := range past {
		w.free(kv[0], kv[1])
	}
	return w.ops
}

// repeatLastStep returns ops with its last step (from its last step mark)
// repeated until the trace has steps steps after its first mark: the
// blocks the step allocates and frees are allocated and freed again,
// in the same order, after a mark of their own; the ops that free what
// was allocated before the step come once, at the end. A training loop
// runs thousands of steps; the shared traces hold three.
func repeatLastStep(ops []trace.Op, steps int) []trace.Op {
	last, marks := -1, 0
	for i, op := range ops {
		if op.Kind == trace.Mark {
			last = i
			marks++
		}
	}
	if last < 0 {
		return ops
	}
	mine := map[uint64]bool{}
	var body, tail []trace.Op
	for _, op := range ops[last+1:] {
		switch {
		case op.Kind == trace.Alloc:
			mine[op.ID] = true
			body = append(body, op)
		case op.Kind == trace.Free && !mine[op.ID]:
			tail = append(tail, op)
		default:
			body = append(body, op)
		}
	}
	out := append([]trace.Op(nil), ops[:last+1]...)
	out = append(out, body...)
	for range steps - marks {
		out = append(out, ops[last])
		out = append(out, body...)
	}
	return append(out, tail...)
}

// withSideInput returns ops with each step's input copied on a stream of
// its own, as a data loader's prefetch does: after each mark, two blocks
// (token ids and attention mask, int64, batch 2 of 128 tokens) allocated
// on stream 1 and recorded on stream 0, which reads them; freed at the
// step's end, before the next mark (the last ones at the end).
func withSideInput(ops []trace.Op) []trace.Op {
	var next uint64
	for _, op := range ops {
		next = max(next, op.ID+1)
	}
	w := &opWriter{next: next}
	var held []uint64
	for _, op := range ops {
		if op.Kind == trace.Mark {
			w.free(held...)
			w.ops = append(w.ops, op)
			ids, mask := w.alloc(2*128*8, 1), w.alloc(2*128*8, 1)
			w.record(ids, 0)
			w.record(mask, 0)
			held = []uint64{ids, mask}
			continue
		}
		w.ops = append(w.ops, op)
	}
	w.free(held...)
	return w.ops
}

// batchSteps mixes traces of one program at several batch sizes (the
// same operations, only the sizes differ): the allocations of the
// step-th step (0 before the first mark) are those of
// batches[batch(step)]; the marks are left out when marked is false.
func batchSteps(t testing.TB, batches [][]trace.Op, marked bool, batch func(step int) int) []trace.Op {
	var out []trace.Op
	marks := 0
	for _, b := range batches[1:] {
		require.Len(t, b, len(batches[0]))
	}
	for i, op := range batches[0] {
		for _, b := range batches[1:] {
			if b[i].Kind != op.Kind || b[i].ID != op.ID {
				t.Fatalf("op %d: %v of block %d in one trace, %v of block %d in another", i, op.Kind, op.ID, b[i].Kind, b[i].ID)
			}
		}
		if op.Kind == trace.Mark {
			if marks++; !marked {
				continue
			}
		}
		if op.Kind == trace.Alloc {
			op.Size = batches[batch(marks)][i].Size
		}
		out = append(out, op)
	}
	return out
}

// bertBatchOrder is the batch of bertBatches' steps from the third on,
// an index into bert_b8, bert_b4, bert_b2, repeated as needed: never the
// same batch twice in a row, batch 8 first at the sixth step.
var bertBatchOrder = []int{1, 2, 1, 0, 2, 1, 0, 1, 2, 0, 1, 2, 0, 2, 1, 0, 1, 2}

// bertBatches returns BERT's training trace of steps steps whose batch
// changes every step, as a sampler that buckets examples by length feeds
// a model: the first two steps at batch 2, then bert_b4's, bert_b2's and
// bert_b8's repeated last step in bertBatchOrder.
func bertBatches(t testing.TB, steps int) []trace.Op {
	const td = "../trace/replay/testdata/"
	var batches [][]trace.Op
	for _, f := range []string{"bert_b8", "bert_b4", "bert_b2"} {
		batches = append(batches, repeatLastStep(fileOps(td+f+".trace.gz")(t), steps))
	}
	return batchSteps(t, batches, true, func(s int) int {
		if s < 3 {
			return 2
		}
		return bertBatchOrder[(s-3)%len(bertBatchOrder)]
	})
}

// bertTrainEval returns BERT's training trace (bert_b2) with rounds
// rounds after its three steps, each of four evaluation steps and six
// training steps, each step marked. The training step is the trace's
// last; an evaluation step is its forward pass (its operations up to the
// most blocks it holds at once in its first half of allocations, 195
// blocks after 298 allocations, where the backward pass starts to free
// them), then the frees of the blocks it allocated and still holds, the
// last allocated first: a step of another shape, as an evaluation every
// so many training steps makes.
func bertTrainEval(t testing.TB, rounds int) []trace.Op {
	ops := fileOps("../trace/replay/testdata/bert_b2.trace.gz")(t)
	last := -1
	for i, op := range ops {
		if op.Kind == trace.Mark {
			last = i
		}
	}
	one := repeatLastStep(ops, 3) // the last step once, its ops split into body and tail
	head := ops[:last+1]
	rest := one[len(head):]
	mine := map[uint64]bool{}
	bodyEnd, allocs := len(rest), 0
	for i, op := range rest {
		if op.Kind == trace.Alloc {
			mine[op.ID] = true
			allocs++
		} else if op.Kind == trace.Free && !mine[op.ID] {
			bodyEnd = min(bodyEnd, i) // the tail: frees of blocks from before the step
		}
	}
	var held, peak, n int
	peakAt := 0
	for i, op := range rest[:bodyEnd] {
		switch op.Kind {
		case trace.Alloc:
			if n++; n > allocs/2 {
				break
			}
			if held++; held > peak {
				peak, peakAt = held, i
			}
		case trace.Free:
			held--
		}
	}
	body, tail := rest[:bodyEnd], rest[bodyEnd:]
	var eval []trace.Op
	inUse := map[uint64]bool{}
	var order []uint64
	for _, op := range body[:peakAt+1] {
		eval = append(eval, op)
		switch op.Kind {
		case trace.Alloc:
			inUse[op.ID] = true
			order = append(order, op.ID)
		case trace.Free:
			delete(inUse, op.ID)
		}
	}
	for i := len(order) - 1; i >= 0; i-- {
		if inUse[order[i]] {
			eval = append(eval, trace.Op{Kind: trace.Free, ID: order[i]})
		}
	}
	mark := ops[last]
	out := append([]trace.Op(nil), head...)
	out = append(out, body...)
	for range rounds {
		for range 4 {
			out = append(append(out, mark), eval...)
		}
		for range 6 {
			out = append(append(out, mark), body...)
		}
	}
	return append(out, tail...)
}
