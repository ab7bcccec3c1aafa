// This file holds the program: the parameters' storage, and the steps a
// training loop or an inference run takes, one layer at a time, as an
// allocation stream. Its memory grows with the layers only by what a real
// run keeps per layer.

package estimate

// cuBLASWorkspace is the workspace PyTorch's cuBLAS handle takes from the
// caching allocator on a thread's first matrix product (4096 KiB × 2 +
// 16 KiB × 8, the CUBLAS_WORKSPACE_CONFIG default before Hopper). Training
// has two: the forward thread's and autograd's backward thread's.
const cuBLASWorkspace = 4096<<10*2 + 16<<10*8

// bareChunk is how a bare parameter count is divided into tensors: 64 Mi
// parameters each (rows of 4096), or, past maxBareTensors of them (about
// 275 billion parameters), maxBareTensors equal tensors, so that the
// simulation of a bare count costs the same however large the count (it
// grew with the count, to gigabytes at 100 trillion).
const (
	bareChunk      = 1 << 26
	maxBareTensors = 4096
)

// bareChunkOf returns the parameters of each tensor of a bare count of n.
func bareChunkOf(n uint64) uint64 {
	if n <= bareChunk*maxBareTensors {
		return bareChunk
	}
	return ceilDiv(ceilDiv(n, maxBareTensors), 4096) * 4096
}

type program struct {
	pl     *Plan
	m      *Model // nil for a bare parameter count
	w      *Workload
	t      *tape
	units  []*unit // embeddings, blocks, head; for a bare count, one unit per chunk
	caches []layerCache
	ops    [][]*op // each unit's recorded operations during a step
	ckpts  map[int]ckpt
	held   []*tensor // the caller's references to the last step's outputs
	gpus   uint64    // the GPUs state is sharded over (1 without sharding)
	ddp    bool      // data parallel replicas with gradient buckets
	host   uint64    // bytes kept in host memory
	steps  int       // training steps to run (trainingSteps when 0)
	after  func(step int) error
	stop   error // what after returned to stop the run
}

func newProgram(pl *Plan, s sink) *program {
	p := &program{pl: pl, m: pl.Model, w: &pl.Workload, t: &tape{s: s}, gpus: uint64(pl.Workload.GPUs)}
	if p.w.Shard == NoShard {
		p.gpus, p.ddp = 1, p.w.GPUs > 1 && p.w.Mode.training()
	}
	p.build()
	return p
}

// build creates the units and their parameters.
func (p *program) build() {
	w := p.w
	if p.m == nil {
		var ss []spec
		chunk := bareChunkOf(uint64(p.pl.Params))
		for left := uint64(p.pl.Params); left > 0; {
			n := min(left, chunk)
			if n >= 4096 {
				ss = append(ss, spec{roleQ, n / 4096, 4096})
			}
			if n%4096 != 0 {
				ss = append(ss, spec{roleQ, 1, n % 4096})
			}
			left -= n
		}
		for _, s := range ss { // one unit per tensor, as gradient buckets reduce them
			p.units = append(p.units, p.newUnit([]spec{s}, false))
		}
		return
	}
	m := p.m
	p.units = append(p.units, p.newUnit(m.embedSpecs(), false))
	layer := m.layerSpecs()
	for range m.Layers {
		p.units = append(p.units, p.newUnit(layer, w.Mode == LoRA || w.Mode == QLoRA))
	}
	head := p.newUnit(m.headSpecs(), false)
	if m.TieEmbeddings && m.Head == LMHead {
		head.tied = p.units[0].embs[0]
	}
	p.units = append(p.units, head)
	p.ops = make([][]*op, len(p.units))
	p.ckpts = map[int]ckpt{}
}

// newUnit makes the parameters of specs: linear weights with the bias
// that follows them, norms, embedding tables; LoRA adapters on targeted
// linear layers of the blocks.
func (p *program) newUnit(ss []spec, adapt bool) *unit {
	w := p.w
	_, _, gradBytes, _ := w.trainBytes()
	u := &unit{}
	newParam := func(s spec, train bool) *param {
		x := &param{spec: s, train: train}
		if train {
			x.gradN = mul(s.elems(), gradBytes)
		}
		u.params = append(u.params, x)
		return x
	}
	full := w.Mode == Full
	for i := 0; i < len(ss); i++ {
		s := ss[i]
		switch {
		case s.role == roleEmbed || s.role == rolePos:
			u.embs = append(u.embs, newParam(s, full))
		case s.role.linear() || s.role == roleHead:
			l := &lin{w: newParam(s, full), out: s.rows, in: s.cols}
			if i+1 < len(ss) && ss[i+1].role == roleBias {
				i++
				l.b = newParam(ss[i], full)
			}
			if s.role.linear() {
				switch {
				case w.Mode == QLoRA || (w.Mode == Infer && w.Precision == Int4):
					l.quant = Int4
				case w.Mode == Infer && w.Precision == Int8:
					l.quant = Int8
				}
			}
			u.lins = append(u.lins, l)
		default:
			u.norms = append(u.norms, newParam(s, full))
		}
	}
	if adapt {
		r := uint64(w.LoRARank)
		for _, l := range u.lins {
			if p.targeted(l.w.role) {
				a := newParam(spec{roleHead, r, l.in}, true)
				b := newParam(spec{roleHead, l.out, r}, true)
				l.lora = &adapter{a: a, b: b, rank: r}
			}
		}
	}
	return u
}

// targeted reports whether LoRA adapts a linear layer of this role.
// GPT-2's fused projection counts as q, k and v.
func (p *program) targeted(r role) bool {
	for _, t := range p.w.LoRATargets {
		switch t {
		case "all":
			return r.linear()
		case "q":
			if r == roleQ || r == roleQKV {
				return true
			}
		case "k":
			if r == roleK || r == roleQKV {
				return true
			}
		case "v":
			if r == roleV || r == roleQKV {
				return true
			}
		case "o":
			if r == roleO {
				return true
			}
		case "gate":
			if r == roleGate {
				return true
			}
		case "up":
			if r == roleUp {
				return true
			}
		case "down":
			if r == roleDown {
				return true
			}
		}
	}
	return false
}

// quantOf returns how a parameter is stored quantized (0 if not).
func (u *unit) quantOf(x *param) Precision {
	for _, l := range u.lins {
		if l.w == x {
			return l.quant
		}
	}
	return 0
}

// stored returns the bytes of the tensors that hold x on the GPU, in its
// resident form, and what the host holds for it.
func (p *program) stored(u *unit, x *param) (gpu []uint64, host uint64) {
	e := x.elems()
	switch u.quantOf(x) {
	case Int8: // int8 weight, fp32 scale per row (bitsandbytes SCB)
		return []uint64{e, mul(x.rows, 4)}, 0
	case Int4: // packed NF4, 8-bit block absmax per 64, fp32 absmax per 256 blocks
		return []uint64{ceilDiv(e, 2), ceilDiv(e, 64), mul(ceilDiv(e, 64*256), 4)}, 0
	}
	w := p.w
	if !x.train {
		if w.Precision == FP32 {
			return []uint64{mul(e, 4)}, 0
		}
		return []uint64{mul(e, 2)}, 0
	}
	master, half, _, _ := w.trainBytes()
	if w.Offload.optimizer() && w.Optimizer != NoOptimizer {
		// The GPU keeps the compute copy; the host the fp32 master, an
		// fp32 copy of the gradient and the optimizer state.
		host = add(mul(e, 8), p.stateBytes(x))
		if half > 0 {
			return []uint64{mul(e, half)}, host
		}
		return []uint64{mul(e, master)}, host
	}
	return []uint64{mul(e, master), mul(e, half)}, 0
}

// computeBytes is what a unit's gathered weights take on the GPU while in
// use (zero3, fsdp, params offload): each parameter in its compute form.
func (p *program) computeBytes(u *unit) uint64 {
	var n uint64
	for _, x := range u.params {
		gpu, _ := p.stored(u, x)
		if x.train {
			_, half, _, _ := p.w.trainBytes()
			if half > 0 {
				n = add(n, mul(x.elems(), half))
				continue
			}
		}
		n = add(n, gpu[0])
		for _, g := range gpu[1:] {
			if !x.train {
				n = add(n, g)
			}
		}
	}
	return n
}

// streamed reports whether units are gathered one at a time.
func (p *program) streamed() bool {
	return p.w.Shard.params() || p.w.Offload.params()
}

// setup allocates every unit's resident weights.
func (p *program) setup() {
	t := p.t
	t.s.phase("setup")
	for _, u := range p.units {
		var all uint64
		for _, x := range u.params {
			gpu, host := p.stored(u, x)
			if p.w.Shard.states() { // each process offloads its shard
				host = ceilDiv(host, p.gpus)
			}
			p.host = add(p.host, host)
			if p.w.Offload.params() { // gradients follow the weights to the host
				p.host = add(p.host, ceilDiv(x.gradN, p.gpus))
			}
			for i, n := range gpu {
				switch {
				case !p.streamed():
					u.store = append(u.store, t.alloc(n, catWeights))
				case !x.train || i == 0: // a streamed unit's half copies are made when gathered
					all = add(all, n)
				}
			}
		}
		switch {
		case p.w.Offload.params():
			p.host = add(p.host, ceilDiv(all, p.gpus))
		case p.streamed():
			u.store = append(u.store, t.alloc(ceilDiv(all, p.gpus), catWeights))
		}
		if t.failed {
			return
		}
	}
}

// gather brings a streamed unit's weights onto the GPU for its use.
func (p *program) gather(u *unit) {
	if p.streamed() && u.gathered == nil {
		u.gathered = p.t.alloc(p.computeBytes(u), catTemporary)
	}
}

func (p *program) ungather(u *unit) {
	if u.gathered != nil {
		p.t.release(u.gathered)
		u.gathered = nil
	}
}

// reduce handles a unit's gradients once its backward is done: sharded
// (reduce-scatter into a 1/N shard), sent to the host, or copied into a
// DDP bucket.
func (p *program) reduce(u *unit) {
	t, w := p.t, p.w
	var n uint64
	for _, x := range u.params {
		if x.grad != nil && x.grad.live {
			n = add(n, x.gradN)
		}
	}
	if n == 0 {
		return
	}
	switch {
	case w.Offload.params(): // sent to the host as each layer finishes
		p.freeGrads(u)
	case w.Shard.grads():
		if u.shard == nil || !u.shard.live {
			u.shard = t.alloc(ceilDiv(n, p.gpus), catGrads)
		}
		p.freeGrads(u)
	case p.ddp && u.bucket == nil:
		u.bucket = t.alloc(n, catGrads)
	}
}

func (p *program) freeGrads(u *unit) {
	for _, x := range u.params {
		if x.grad != nil {
			p.t.release(x.grad)
			x.grad = nil
		}
	}
}

// zeroGrad is zero_grad(set_to_none=True): gradients and gradient shards
// are freed (DDP buckets stay).
func (p *program) zeroGrad() {
	for _, u := range p.units {
		p.freeGrads(u)
		if u.shard != nil {
			p.t.release(u.shard)
			u.shard = nil
		}
	}
}

// caller drops the outputs the caller held from the previous step.
func (p *program) dropHeld() {
	p.t.drop(p.held...)
	p.held = nil
	for i := range p.caches {
		p.t.drop(p.caches[i].k, p.caches[i].v)
		p.caches[i] = layerCache{}
	}
}

// checkpointed reports whether layer l is recomputed in backward.
func (p *program) checkpointed(l int) bool {
	k := p.w.Checkpointing
	return k == 1 || (k > 1 && l%k == 0)
}
