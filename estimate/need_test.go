package estimate

import (
	"testing"

	"github.com/gpumem/gpumem/allocator"
)

// fitsAt reports whether pl fits a card of c bytes, by a simulation of
// its own (not the recorded stream the search replays).
func fitsAt(t *testing.T, pl Plan, c uint64) bool {
	t.Helper()
	pl.Capacity = c
	ok, err := pl.Fits()
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// The need is the smallest capacity that runs, as a bisection over
// capacities finds it: the plan fits on MinCapacity and not one Step
// below, and Fits says MinCapacity <= Capacity on both sides of it.
func TestMinCapacityIsTheEdge(t *testing.T) {
	llama, _ := Preset("llama-7b")
	gpt2, _ := Preset("gpt2")
	tiny, _ := Preset("tinyllama-1.1b")
	bert, _ := Preset("bert-base")
	expandable, err := allocator.ParseConf("expandable_segments:True")
	if err != nil {
		t.Fatal(err)
	}
	for name, pl := range map[string]Plan{
		"7B amp-bf16 AdamW batch 4": {Model: &llama, Workload: Workload{Precision: AMPBF16, Batch: 4}},
		"gpt2 batch 8":              {Model: &gpt2, Workload: Workload{Batch: 8}},
		"gpt2 expandable":           {Model: &gpt2, Workload: Workload{Batch: 8}, Alloc: expandable},
		"gpt2 fsdp over 4":          {Model: &gpt2, Workload: Workload{Batch: 4, GPUs: 4, Shard: FSDP}},
		"bert eager":                {Model: &bert, Workload: Workload{Batch: 16, Seq: 128, Attention: Eager}},
		"tinyllama inference":       {Model: &tiny, Workload: Workload{Mode: Infer, Batch: 4, Seq: 512, Generate: 64}},
		"bare 1B":                   {Params: 1e9, Workload: Workload{Precision: AMPBF16}},
		"no context":                {Model: &gpt2, Workload: Workload{Batch: 2}, Context: -1},
	} {
		t.Run(name, func(t *testing.T) {
			pl.Capacity = 80 << 30
			r, err := pl.Estimate()
			if err != nil {
				t.Fatal(err)
			}
			m := r.MinCapacity
			if m == 0 {
				t.Fatal("no capacity runs it")
			}
			if !fitsAt(t, pl, m) || fitsAt(t, pl, m-Step) {
				t.Errorf("min capacity %d: fits there %v, one step below %v; want true, false", m, fitsAt(t, pl, m), fitsAt(t, pl, m-Step))
			}
			for _, c := range []uint64{m, m - Step, m + Step} {
				q := pl
				q.Capacity = c
				r, err := q.Estimate()
				if err != nil {
					t.Fatal(err)
				}
				if r.MinCapacity != m || r.Fits != (m <= c) {
					t.Errorf("on %d: min capacity %d, fits %v; want %d, %v", c, r.MinCapacity, r.Fits, m, m <= c)
				}
			}
			ctx := uint64(max(r.Plan.Context, 0))
			if m < uint64(r.Breakdown.Total) {
				t.Errorf("min capacity %d is below the counted peak plus the context, %d", m, r.Breakdown.Total)
			}
			if r.Fits && m > uint64(r.Sim.PeakReserved)+ctx {
				t.Errorf("min capacity %d is above the peak reserved %d plus the context on a card that runs it", m, r.Sim.PeakReserved)
			}
			if need, err := pl.Need(); err != nil || need != int64(m) {
				t.Errorf("Need %d, %v; want %d", need, err, m)
			}
		})
	}
}

// The 7B mixed-precision AdamW example: the old need, the peak reserved
// on a roomy device plus the context (135.52 GiB), was more than a card
// it runs on (130 GiB). Under pressure the allocator frees its cache and
// retries, so the run fits below that peak.
func TestNeed7BFitsWhatItSays(t *testing.T) {
	m, _ := Preset("llama-7b")
	pl := Plan{Model: &m, Workload: Workload{Precision: AMPBF16, Batch: 4}, Capacity: 80 << 30}
	r, err := pl.Estimate()
	if err != nil {
		t.Fatal(err)
	}
	if r.Fits {
		t.Fatal("7B full training fits 80 GiB")
	}
	roomy := pl
	roomy.Capacity = MaxDevice
	big, err := roomy.Estimate()
	if err != nil {
		t.Fatal(err)
	}
	old := uint64(big.Sim.PeakReserved) + DefaultContext
	if r.MinCapacity >= old {
		t.Errorf("needs %s, not below the roomy peak reserved plus context %s", FormatBytes(i64(r.MinCapacity)), FormatBytes(i64(old)))
	}
	if r.MinCapacity > 130<<30 || !fitsAt(t, pl, 130<<30) {
		t.Errorf("needs %s; fits 130 GiB: %v", FormatBytes(i64(r.MinCapacity)), fitsAt(t, pl, 130<<30))
	}
}

// A plan that no simulated device runs needs 0 (more than MaxDevice), and
// does not fit.
func TestNeedBeyondTheLargestDevice(t *testing.T) {
	pl := Plan{Params: MaxParameters, Workload: Workload{Precision: FP32}, Capacity: MaxDevice}
	r, err := pl.Estimate()
	if err != nil {
		t.Fatal(err)
	}
	if r.MinCapacity != 0 || r.Fits {
		t.Errorf("min capacity %d, fits %v; want 0, false", r.MinCapacity, r.Fits)
	}
	if n, err := pl.Need(); n != 0 || err != nil {
		t.Errorf("Need %d, %v; want 0, nil", n, err)
	}
}

// Replays made in parallel find what one at a time finds.
func TestMinDeviceWorkers(t *testing.T) {
	gpt2, _ := Preset("gpt2")
	llama, _ := Preset("tinyllama-1.1b")
	for _, pl := range []Plan{
		{Model: &gpt2, Workload: Workload{Batch: 8}, Capacity: 80 << 30},
		{Model: &llama, Workload: Workload{Precision: AMPBF16, Batch: 4, Seq: 1024}, Capacity: 24 << 30},
	} {
		if err := pl.Normalize(); err != nil {
			t.Fatal(err)
		}
		_, _, s := record(&pl)
		var got []uint64
		for _, w := range []int{1, 3, 8} {
			ans, err := minDeviceWith(&search{pl: &pl, s: s, workers: w, runs: map[uint64]bool{}}, 0)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, ans)
		}
		if got[0] == 0 || got[1] != got[0] || got[2] != got[0] {
			t.Errorf("%s: smallest device with 1, 3 and 8 workers: %v", pl.Model.Name, got)
		}
	}
}
