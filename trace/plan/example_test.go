package plan_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"strings"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/plan"
)

func readTrace(path string) []trace.Op {
	ops, err := trace.ReadFile(path)
	if err != nil {
		log.Fatal(err)
	}
	return ops
}

// Fit finds the smallest device a trace runs on, here a BERT-base training
// run at batch 2, with PyTorch's default configuration and with
// expandable segments.
func ExampleFit() {
	ops := readTrace("testdata/batches/bert_b2.trace.gz")
	for _, conf := range []string{"", "expandable_segments:True"} {
		cfg, err := allocator.ParseConf(conf)
		if err != nil {
			log.Fatal(err)
		}
		r, err := plan.Fit(ops, plan.FitOptions{Config: cfg})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%q: runs on %d MiB, not on %d MiB (%d allocations fail); %.3f x the peak requested\n",
			conf, r.MinCapacity>>20, (r.MinCapacity-plan.Step)>>20, r.BelowOOMs, r.FitRatio)
	}
	// Output:
	// "": runs on 2746 MiB, not on 2744 MiB (4 allocations fail); 1.096 x the peak requested
	// "expandable_segments:True": runs on 2532 MiB, not on 2530 MiB (2 allocations fail); 1.010 x the peak requested
}

// A trace on which a bigger device is worse: it runs on 62 MiB, not on
// 70 MiB, and on everything tried from 72 MiB up.
func ExampleFit_nonMonotone() {
	ops, err := trace.ReadAll(strings.NewReader("a 1 31457280\nf 1\na 2 41943040\na 3 3145728\na 4 1048576\nf 3\nf 2\na 5 1048576\na 6 46137344\nf 6\na 7 32505856\n"))
	if err != nil {
		log.Fatal(err)
	}
	r, err := plan.Fit(ops, plan.FitOptions{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("smallest:", r.MinCapacity>>20, "MiB")
	for _, c := range r.NonMonotone {
		fmt.Println("fails above it on:", c>>20, "MiB")
	}
	fmt.Println("runs from:", r.SafeCapacity>>20, "MiB")
	// Output:
	// smallest: 62 MiB
	// fails above it on: 70 MiB
	// runs from: 72 MiB
}

// Two probes at batch 2 and 4 predict the run at batch 8, and the largest
// batch that fits a 4 GiB device. "measured" is the batch-8 trace (a
// PyTorch 1.13 capture, as the probes are) replayed.
func ExampleNewModel() {
	m, err := plan.NewModel(
		plan.Probe{Name: "bert_b2", Batch: 2, Ops: readTrace("testdata/batches/bert_b2.trace.gz")},
		plan.Probe{Name: "bert_b4", Batch: 4, Ops: readTrace("testdata/batches/bert_b4.trace.gz")},
	)
	if err != nil {
		log.Fatal(err)
	}
	pred, err := m.Predict(8, allocator.Config{}, 0)
	if err != nil {
		log.Fatal(err)
	}
	real, err := plan.Replay(readTrace("testdata/batches/bert_b8.trace.gz"), allocator.Config{}, 0)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("batch 8: predicted peak reserved %d, measured %d\n", pred.PeakReserved, real.PeakReserved)
	mb, err := m.MaxBatch(allocator.Config{}, 4<<30)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("largest batch on 4 GiB:", mb.MaxBatch)
	// Output:
	// batch 8: predicted peak reserved 2965372928, measured 2965372928
	// largest batch on 4 GiB: 30
}

// Tune ranks configurations; the best comes with the line to give PyTorch.
func ExampleTune() {
	ops := readTrace("testdata/batches/bert_b2.trace.gz")
	var cands []plan.Candidate
	for _, conf := range []string{"", "expandable_segments:True", "max_split_size_mb:128", "roundup_power2_divisions:8"} {
		c, err := plan.NewCandidate(conf)
		if err != nil {
			log.Fatal(err)
		}
		cands = append(cands, c)
	}
	res, err := plan.Tune(ops, plan.TuneOptions{Candidates: cands})
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range res {
		fmt.Printf("%-28q %d MiB\n", r.Conf, r.Fit.MinCapacity>>20)
	}
	conf, _, _ := plan.PyTorchSetting(res[0].Config)
	fmt.Println("PYTORCH_CUDA_ALLOC_CONF=" + conf)
	// Output:
	// "expandable_segments:True"   2532 MiB
	// ""                           2746 MiB
	// "max_split_size_mb:128"      2746 MiB
	// "roundup_power2_divisions:8" 2782 MiB
	// PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
}

// FitContext stops when its context is done, as at a Ctrl-C or a
// deadline: here the context is cancelled before the search begins.
func ExampleFitContext() {
	ops := readTrace("testdata/batches/bert_b2.trace.gz")
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // in a program: on SIGINT (signal.NotifyContext) or a deadline
	_, err := plan.FitContext(ctx, ops, plan.FitOptions{})
	fmt.Println(errors.Is(err, context.Canceled), err)
	// Output:
	// true fit stopped: context canceled
}
