// This file holds `gpumem estimate`: will this model train on this card.

package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/gpumem/gpumem/estimate"
	"github.com/gpumem/gpumem/stats"
)

func runEstimate(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("estimate", "[--layers N --hidden N --heads N --vocab N --seq N --batch N --dtype fp32|bf16|fp16 --optimizer adam|momentum|sgd] [--capacity SIZE] [--conf CONF] [--max-batch]", stderr)
	var m estimate.Model
	fs.IntVar(&m.Layers, "layers", 12, "transformer layers")
	fs.IntVar(&m.Hidden, "hidden", 768, "hidden size")
	fs.IntVar(&m.Heads, "heads", 12, "attention heads")
	fs.IntVar(&m.Vocab, "vocab", 50257, "vocabulary size")
	fs.IntVar(&m.Seq, "seq", 1024, "tokens per sequence")
	fs.IntVar(&m.Batch, "batch", 8, "sequences per step")
	dtype := fs.String("dtype", "fp32", "element type: fp32, bf16 or fp16")
	opt := fs.String("optimizer", "adam", "optimizer: adam, momentum or sgd")
	capacity := &sizeFlag{80 << 30}
	fs.Var(capacity, "capacity", "device memory (80GiB, 24GiB, bytes)")
	conf := fs.String("conf", "", "allocator configuration, PYTORCH_CUDA_ALLOC_CONF syntax")
	maxBatch := fs.Bool("max-batch", false, "also find the largest batch that fits")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("unexpected argument %q", fs.Arg(0))}
	}
	switch strings.ToLower(*dtype) {
	case "fp32", "float32":
		m.Bytes = 4
	case "bf16", "fp16", "bfloat16", "float16":
		m.Bytes = 2
	default:
		return usageError{fmt.Sprintf("unknown dtype %q (want fp32, bf16 or fp16)", *dtype)}
	}
	var err error
	if m.Optimizer, err = estimate.ParseOptimizer(*opt); err != nil {
		return usageError{err.Error()}
	}
	if err := m.Validate(); err != nil {
		return usageError{err.Error()}
	}
	cfg, err := resolveConf(fs, *conf)
	if err != nil {
		return err
	}
	r, err := estimate.Simulate(m, capacity.n, cfg, 2)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d-layer transformer, hidden %d, %d heads, vocab %d: %.1fM parameters, %s, %s; batch %d x %d tokens; device %s\n\n",
		m.Layers, m.Hidden, m.Heads, m.Vocab, float64(m.Params())/1e6, *dtype, m.Optimizer, m.Batch, m.Seq, capacity)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	c := r.Count
	fmt.Fprintf(tw, "counted\tparameters\t%s\n", size(c.Parameters))
	fmt.Fprintf(tw, "\tgradients\t%s\n", size(c.Gradients))
	fmt.Fprintf(tw, "\toptimizer state\t%s\n", size(c.OptimizerState))
	fmt.Fprintf(tw, "\tactivations\t%s\n", size(c.Activations))
	fmt.Fprintf(tw, "\ttotal\t%s\n", size(c.Total))
	res := r.Replay
	fmt.Fprintf(tw, "simulated\tpeak allocated\t%s\n", size(res.PeakAllocated))
	fmt.Fprintf(tw, "\tpeak reserved\t%s (fragmentation %.3f)\n", size(res.PeakReserved), res.Fragmentation)
	fmt.Fprintf(tw, "\tout of memory\t%d\n", res.OOMs)
	tw.Flush()
	fmt.Fprintln(stdout)
	if r.Fits {
		fmt.Fprintf(stdout, "fits: %s of headroom on a %s device\n", size(r.Headroom), capacity)
	} else {
		fmt.Fprintf(stdout, "does not fit: %d allocations failed on a %s device\n", res.OOMs, capacity)
	}
	if *maxBatch {
		n, err := estimate.MaxBatch(m, capacity.n, cfg, 1<<16)
		if err != nil {
			return err
		}
		if n == 0 {
			fmt.Fprintln(stdout, "largest batch that fits: none (even batch 1 runs out of memory)")
		} else {
			fmt.Fprintf(stdout, "largest batch that fits: %d\n", n)
		}
	}
	return nil
}

func size(n int64) string {
	if n < 0 {
		return "-" + stats.FormatSize(uint64(-n))
	}
	return stats.FormatSize(uint64(n))
}
