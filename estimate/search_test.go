package estimate

import (
	"strings"
	"testing"
	"time"
)

func TestMaxBatchIsTheEdge(t *testing.T) {
	gpt2, _ := Preset("gpt2")
	pl := Plan{Model: &gpt2, Workload: Workload{Seq: 512}, Capacity: 24 << 30}
	n, err := pl.MaxBatch(MaxBatch)
	if err != nil {
		t.Fatal(err)
	}
	fits := func(b int) bool {
		q := pl
		q.Workload.Batch = b
		ok, err := q.Fits()
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if n < 2 || !fits(n) || fits(n+1) {
		t.Errorf("largest batch %d: fits(%d) %v, fits(%d) %v", n, n, fits(n), n+1, fits(n+1))
	}
	s, err := pl.MaxSeq(MaxSequence)
	if err != nil {
		t.Fatal(err)
	}
	if s != 1024 {
		t.Errorf("longest sequence %d, want GPT-2's 1024 positions", s)
	}
}

// A model that does not fit at all gives 0, not an error, however large
// the search goes; so does a size too large to represent.
func TestSearchTooBigIsZero(t *testing.T) {
	m, _ := Preset("llama-70b")
	pl := Plan{Model: &m, Workload: Workload{Precision: AMPBF16}, Capacity: 80 << 30}
	for name, f := range map[string]func(int) (int, error){"batch": pl.MaxBatch, "seq": pl.MaxSeq} {
		n, err := f(1 << 30)
		if err != nil || n != 0 {
			t.Errorf("max %s of 70B full training on 80 GiB: %d, %v; want 0, nil", name, n, err)
		}
	}
	l, _ := Preset("llama3-8b")
	q := Plan{Model: &l, Workload: Workload{Mode: Infer, Precision: Int4, Attention: Eager}, Capacity: 80 << 30}
	start := time.Now()
	n, err := q.MaxSeq(MaxSequence)
	if err != nil || n < 4096 || n > 1<<16 {
		t.Errorf("longest int4 context with eager attention on 80 GiB: %d, %v", n, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the search took %v", d)
	}
	q.Workload.Attention, q.Capacity = Flash, MaxDevice
	if n, err := q.MaxSeq(MaxSequence); err != nil || n != MaxSequence {
		t.Errorf("longest int4 context with flash attention on 8 TiB: %d, %v; want the limit", n, err)
	}
}

func TestRemediesLadder(t *testing.T) {
	m, _ := Preset("llama-7b")
	pl := Plan{Model: &m, Workload: Workload{Precision: AMPBF16, Batch: 4, Seq: 2048, Attention: Eager}, Capacity: 80 << 30}
	r, err := pl.Estimate()
	if err != nil {
		t.Fatal(err)
	}
	if r.Fits {
		t.Fatal("7B full training at batch 4 × 2048 fits 80 GiB")
	}
	rs, err := pl.Remedies()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, x := range rs {
		names = append(names, x.Change)
		if x.Need <= 0 {
			t.Errorf("%s: need %d", x.Name, x.Need)
		}
	}
	want := []string{"--batch 2", "--attention flash", "--checkpointing", "--optimizer adam8bit", "--mode lora", "--mode qlora",
		"--offload optimizer", "--offload all", "--gpus"}
	got := strings.Join(names, " | ")
	for i, w := range want {
		if i >= len(names) || !strings.HasPrefix(names[i], w) {
			t.Fatalf("ladder %q, want the order %q", got, want)
		}
	}
	// Sharding divides the state, not the activations: the ladder's last
	// rung fits a 7B model's state at a small batch.
	small := pl
	small.Workload.Batch, small.Workload.Seq, small.Workload.Attention = 1, 512, Flash
	if rs, err := small.Remedies(); err != nil || len(rs) == 0 || !rs[len(rs)-1].Fits {
		t.Errorf("7B at batch 1 × 512: %v, %v", rs, err)
	}
	for _, x := range rs {
		if x.Need >= r.Breakdown.Total*11/10 {
			t.Errorf("%s needs %s, more than the plan's %s", x.Name, FormatBytes(x.Need), FormatBytes(r.Breakdown.Total))
		}
	}
	inf, _ := Preset("llama-70b")
	rs, err = Plan{Model: &inf, Workload: Workload{Mode: Infer}, Capacity: 24 << 30}.Remedies()
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) < 3 || rs[0].Change != "--precision int8" || rs[1].Change != "--precision int4" {
		t.Errorf("inference ladder %v", rs)
	}
}

func TestNeedCoversTheSimulation(t *testing.T) {
	gpt2, _ := Preset("gpt2")
	pl := Plan{Model: &gpt2, Workload: Workload{Batch: 8}, Capacity: 80 << 30}
	need, err := pl.Need()
	if err != nil {
		t.Fatal(err)
	}
	r := estimateOf(t, pl)
	if need != r.Sim.PeakReserved+DefaultContext {
		t.Errorf("need %d, want peak reserved %d + context", need, r.Sim.PeakReserved)
	}
	pl.Capacity = uint64(need)
	if ok, _ := pl.Fits(); !ok {
		t.Error("does not fit in what it needs")
	}
}
