// This file holds `gpumem demo`: a small training loop's allocations on the
// simulated device.

package main

import (
	"fmt"
	"io"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/stats"
)

// model is the toy transformer whose training loop the demo allocates
// for: fp32 tensors, one block per tensor, as a framework would ask.
type model struct {
	layers, hidden, vocab, batch, seq, heads int
}

const f32 = 4

func (m model) params() []uint64 {
	h := uint64(m.hidden)
	ps := []uint64{uint64(m.vocab) * h * f32} // embedding
	for range m.layers {
		ps = append(ps,
			3*h*h*f32, 3*h*f32, // attention qkv weight, bias
			h*h*f32, h*f32, // attention output
			4*h*h*f32, 4*h*f32, // MLP up
			4*h*h*f32, h*f32, // MLP down
			h*f32, h*f32, h*f32, h*f32) // two layer norms (weight, bias)
	}
	return ps
}

func (m model) tokens() uint64 { return uint64(m.batch) * uint64(m.seq) }

// layerActivations are the tensors one layer keeps for backward.
func (m model) layerActivations() []uint64 {
	t, h := m.tokens(), uint64(m.hidden)
	scores := uint64(m.batch) * uint64(m.heads) * uint64(m.seq) * uint64(m.seq) * f32
	return []uint64{t * h * f32, 3 * t * h * f32, scores, scores, t * h * f32, t * 4 * h * f32, t * 4 * h * f32, t * h * f32}
}

// demo runs the allocations of a training loop on a and reports each step.
type demo struct {
	m   model
	a   *allocator.Allocator
	dev *sim.Device
	out io.Writer
	s   device.Stream

	params, optState []device.Ptr
}

func (d *demo) alloc(n uint64) (device.Ptr, error) { return d.a.Alloc(n, d.s) }

func (d *demo) allocAll(sizes []uint64) ([]device.Ptr, error) {
	ps := make([]device.Ptr, 0, len(sizes))
	for _, n := range sizes {
		p, err := d.alloc(n)
		if err != nil {
			return nil, err
		}
		ps = append(ps, p)
	}
	return ps, nil
}

func (d *demo) freeAll(ps []device.Ptr) error {
	for _, p := range ps {
		if err := d.a.Free(p); err != nil {
			return err
		}
	}
	return nil
}

// temporary allocates and frees a short-lived tensor (an intermediate of
// a kernel, a loss scalar).
func (d *demo) temporary(n uint64) error {
	p, err := d.alloc(n)
	if err != nil {
		return err
	}
	return d.a.Free(p)
}

// step runs one training step: optimizer states on the first step (Adam
// keeps two per parameter), forward layer by layer, loss, backward layer by
// layer producing gradients, the optimizer update, and zero_grad.
func (d *demo) step(first bool) error {
	var err error
	if first {
		for _, n := range d.m.params() {
			for range 2 {
				p, err := d.alloc(n)
				if err != nil {
					return err
				}
				d.optState = append(d.optState, p)
			}
		}
	}
	acts := make([][]device.Ptr, d.m.layers)
	for l := range d.m.layers {
		if acts[l], err = d.allocAll(d.m.layerActivations()); err != nil {
			return err
		}
		if err := d.temporary(d.m.tokens() * uint64(d.m.hidden) * f32); err != nil {
			return err
		}
	}
	logits, err := d.alloc(d.m.tokens() * uint64(d.m.vocab) * f32)
	if err != nil {
		return err
	}
	if err := d.temporary(f32); err != nil { // the loss
		return err
	}
	grads := make([]device.Ptr, 0, len(d.params))
	if err := d.a.Free(logits); err != nil {
		return err
	}
	g, err := d.alloc(d.m.params()[0]) // embedding gradient
	if err != nil {
		return err
	}
	grads = append(grads, g)
	perLayer := (len(d.m.params()) - 1) / d.m.layers
	for l := d.m.layers - 1; l >= 0; l-- {
		sizes := d.m.params()[1+l*perLayer : 1+(l+1)*perLayer]
		gs, err := d.allocAll(sizes)
		if err != nil {
			return err
		}
		grads = append(grads, gs...)
		if err := d.temporary(4 * d.m.tokens() * uint64(d.m.hidden) * f32); err != nil {
			return err
		}
		if err := d.freeAll(acts[l]); err != nil {
			return err
		}
	}
	for _, n := range d.m.params() { // the update's temporaries
		if err := d.temporary(n); err != nil {
			return err
		}
	}
	return d.freeAll(grads) // zero_grad(set_to_none=True)
}

func runDemo(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("demo", "[--steps N] [--conf CONF] [--capacity SIZE]", stderr)
	steps := fs.Int("steps", 5, "training steps to run")
	conf := fs.String("conf", "", "allocator configuration, PYTORCH_CUDA_ALLOC_CONF syntax")
	capacity := &sizeFlag{80 << 30}
	fs.Var(capacity, "capacity", "simulated device memory")
	layers := fs.Int("layers", 12, "transformer layers of the toy model")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	if *steps < 1 || *layers < 1 || *layers > 1000 {
		return usageError{"--steps and --layers must be at least 1 (layers at most 1000)"}
	}
	cfg, err := allocator.ParseConf(*conf)
	if err != nil {
		return usageError{err.Error()}
	}
	dev, err := sim.New(sim.Config{Capacity: capacity.n})
	if err != nil {
		return err
	}
	a, err := allocator.New(dev, cfg)
	if err != nil {
		return err
	}
	m := model{layers: *layers, hidden: 1024, vocab: 32000, batch: 8, seq: 512, heads: 16}
	d := &demo{m: m, a: a, dev: dev, out: stdout}
	fmt.Fprintf(stdout, "gpumem demo: a %d-layer transformer (hidden %d, vocab %d, batch %d x %d tokens) training with Adam on %s\n",
		m.layers, m.hidden, m.vocab, m.batch, m.seq, dev)
	if cfg.String() != "" {
		fmt.Fprintf(stdout, "configuration: %s\n", cfg)
	}
	if d.params, err = d.allocAll(m.params()); err != nil {
		return err
	}
	st := a.Stats()
	fmt.Fprintf(stdout, "parameters:  %s, %d device mallocs\n", stats.Line(&st), st.NumDeviceAlloc)
	// Device calls are the allocator's num_device_alloc and num_device_free:
	// cudaMalloc and cudaFree, or page maps and unmaps with expandable
	// segments.
	var laterCalls int64 // device allocations and frees after the first step
	for i := 1; i <= *steps; i++ {
		before := a.Stats()
		clock := dev.Clock()
		if err := d.step(i == 1); err != nil {
			return fmt.Errorf("step %d: %w", i, err)
		}
		after := a.Stats()
		mallocs, frees := after.NumDeviceAlloc-before.NumDeviceAlloc, after.NumDeviceFree-before.NumDeviceFree
		if i > 1 {
			laterCalls += mallocs + frees
		}
		fmt.Fprintf(stdout, "step %-3d     %s | device mallocs %d, frees %d, device time %v\n", i, stats.Line(&after),
			mallocs, frees, dev.Clock()-clock)
	}
	st = a.Stats()
	fmt.Fprintf(stdout, "\n%d allocations served with %d device mallocs", st.Allocation[stats.All].Allocated, st.NumDeviceAlloc)
	switch {
	case *steps == 1:
		fmt.Fprint(stdout, ".\n\n")
	case laterCalls == 0:
		fmt.Fprint(stdout, ": every step after the first was served from the cache, with no device call.\n\n")
	default:
		fmt.Fprintf(stdout, ": the steps after the first still made %d device calls.\n\n", laterCalls)
	}
	fmt.Fprint(stdout, stats.Summary(&st, stats.SummaryOptions{Device: dev.Ordinal(), Name: dev.Name()}))
	if err := a.CheckInvariants(); err != nil {
		return fmt.Errorf("allocator invariants: %w", err)
	}
	return nil
}
