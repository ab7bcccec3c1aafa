package estimate

import (
	"strings"
	"testing"
)

// ladderOf returns the ladder of pl and checks the rule every ladder
// keeps: each rung makes the plan fit its card, with what it needs, and
// only the last may be a combination.
func ladderOf(t *testing.T, pl Plan) []Remedy {
	t.Helper()
	rs, err := pl.Remedies()
	if err != nil {
		t.Fatal(err)
	}
	for i, x := range rs {
		if x.Need <= 0 || uint64(x.Need) > pl.Capacity {
			t.Errorf("%s needs %s on a %s card", x.Change, FormatBytes(x.Need), FormatBytes(i64(pl.Capacity)))
		}
		if x.Combined && i != len(rs)-1 {
			t.Errorf("combination %s is not the last rung", x.Change)
		}
	}
	return rs
}

func changesOf(rs []Remedy) string {
	var s []string
	for _, x := range rs {
		s = append(s, x.Change)
	}
	return strings.Join(s, " | ")
}

// Only changes that make the plan fit are listed, cheapest first; those
// that do not change the answer (checkpointing, a smaller batch, for a
// 7B model's state) are not.
func TestRemediesOnlyThoseThatFit(t *testing.T) {
	m, _ := Preset("llama-7b")
	pl := Plan{Model: &m, Workload: Workload{Precision: AMPBF16, Batch: 4}, Capacity: 80 << 30}
	rs := ladderOf(t, pl)
	want := "--optimizer adam8bit | --mode lora | --mode qlora | --offload optimizer | --offload all | --gpus 2 --shard fsdp"
	if got := changesOf(rs); got != want {
		t.Errorf("ladder %q, want %q", got, want)
	}
	for _, drop := range []func(*Workload){
		func(w *Workload) { w.Checkpointing = 1 },
		func(w *Workload) { w.Batch = 1 },
	} {
		q := pl
		drop(&q.Workload)
		if ok, _ := q.Fits(); ok {
			t.Errorf("%+v fits, and is not on the ladder", q.Workload)
		}
	}
	// Each rung, applied, fits as the ladder says.
	q := pl
	q.Workload.Optimizer = Adam8bit
	r, err := q.Estimate()
	if err != nil {
		t.Fatal(err)
	}
	if !r.Fits || int64(r.MinCapacity) != rs[0].Need {
		t.Errorf("8-bit Adam: fits %v, needs %d; the ladder says %d", r.Fits, r.MinCapacity, rs[0].Need)
	}
}

// A plan that nothing makes fit has an empty ladder: no "shard over 1024
// GPUs" that still does not fit.
func TestRemediesNoneThatDoNotFit(t *testing.T) {
	m, _ := Preset("llama-70b")
	pl := Plan{Model: &m, Workload: Workload{Batch: 64, Seq: 4096, Attention: Eager}, Capacity: 8 << 30}
	if rs := ladderOf(t, pl); len(rs) != 0 {
		t.Errorf("ladder %q, want none", changesOf(rs))
	}
	// A bare count: the GPUs rung is the fewest GPUs that fit.
	bare := Plan{Params: 70e9, Workload: Workload{Precision: BF16, Optimizer: SGD}, Capacity: 8 << 30}
	if rs := ladderOf(t, bare); changesOf(rs) != "--offload all | --gpus 64 --shard fsdp" {
		t.Errorf("bare ladder %q", changesOf(rs))
	}
	for _, n := range []int{32, 64} {
		if ok, _ := bare.withGPUs(n).Fits(); ok != (n == 64) {
			t.Errorf("over %d GPUs fits %v", n, ok)
		}
	}
	// A plan that fits has no ladder.
	gpt2, _ := Preset("gpt2")
	if rs := ladderOf(t, Plan{Model: &gpt2, Capacity: 80 << 30}); len(rs) != 0 {
		t.Errorf("a plan that fits: %q", changesOf(rs))
	}
}

// When no single change fits, the ladder ends with the cheapest
// combination that does, and each of its changes is needed.
func TestRemediesCombination(t *testing.T) {
	m, _ := Preset("llama-7b")
	for _, c := range []struct {
		name string
		pl   Plan
		want string
	}{
		{"checkpointing and 8-bit Adam", Plan{Model: &m, Workload: Workload{Precision: AMPBF16, Batch: 4, Seq: 2048, Attention: Eager}, Capacity: 80 << 30},
			"--checkpointing --optimizer adam8bit"},
		{"a smaller batch with checkpointing", Plan{Model: &m, Workload: Workload{Mode: LoRA, Precision: AMPBF16, Batch: 16, Seq: 2048}, Capacity: 24 << 30},
			"--batch 6 --checkpointing"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rs := ladderOf(t, c.pl)
			if len(rs) != 1 || !rs[0].Combined || rs[0].Change != c.want {
				t.Fatalf("ladder %q, want the combination %q alone", changesOf(rs), c.want)
			}
		})
	}
	// The pieces: each alone does not fit, together they do, and a larger
	// batch does not.
	pl := Plan{Model: &m, Workload: Workload{Mode: LoRA, Precision: AMPBF16, Batch: 16, Seq: 2048}, Capacity: 24 << 30}
	try := func(batch, ckpt int) bool {
		q := pl
		q.Workload.Batch, q.Workload.Checkpointing = batch, ckpt
		ok, err := q.Fits()
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if try(1, 0) || try(16, 1) || !try(6, 1) || try(7, 1) {
		t.Errorf("batch 1: %v; checkpointing: %v; both at 6: %v, at 7: %v", try(1, 0), try(16, 1), try(6, 1), try(7, 1))
	}
}

// The inference ladder quantizes first.
func TestRemediesInference(t *testing.T) {
	m, _ := Preset("llama-70b")
	rs := ladderOf(t, Plan{Model: &m, Workload: Workload{Mode: Infer}, Capacity: 48 << 30})
	if len(rs) == 0 || rs[0].Change != "--precision int4" {
		t.Errorf("inference ladder %q", changesOf(rs))
	}
}
