// The measurements behind POLICY.md: every trace replayed under PyTorch's
// default, expandable segments, the low_fragmentation policy and the
// planned policy, with the offline best (trace/plan/offline's packing)
// and the lower bound beside them, and the synthetic workloads that stand in for
// traces the project does not hold.
//
//	go test ./allocator -run PolicyTable -policy.table -v        # the table
//	go test ./allocator -run PolicyParts -policy.parts -v        # each part changed
//	go test ./allocator -run PolicyTable -policy.write DIR       # the synthetic traces as files
//	go test ./allocator -run '^$' -bench PolicyReplay            # speed, side by side
//	go test ./allocator -run PolicyTimes -policy.times 30 -v     # speed, fastest of 30, x the default
//	go test ./allocator -run PlannedBoundaryWait -policy.boundary -v   # a boundary that packs a large step

package allocator_test

import (
	"flag"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/gpumemtest"
	"github.com/gpumem/gpumem/internal/simtest"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/plan/offline"
	"github.com/gpumem/gpumem/trace/replay"
)

var (
	policyTable = flag.Bool("policy.table", false, "measure every trace under each mode and print POLICY.md's table")
	policyRuns  = flag.Int("policy.runs", 5, "replays per measurement of time (the fastest is reported: the least disturbed by other work on the machine)")
	policyWrite = flag.String("policy.write", "", "write the synthetic traces into this directory as .trace.gz files")
	policyParts = flag.Bool("policy.parts", false, "measure the policy with each of its parts changed (POLICY.md's second table)")
	policyTimes = flag.Int("policy.times", 0, "replay every trace under each mode this many rounds, the modes taking turns, and print the fastest replay of each as a multiple of the faithful default's")
	policySteps = flag.Int("policy.steps", 0, "replay BERT's repeated steps and its batches that change every step, over more and more steps, this many rounds under the faithful default and the planned policy in turns, and print the fastest replay of each")
	policyWait  = flag.Bool("policy.boundary", false, "measure the planned policy's step boundary that packs a step, on steps of 1,000 to 50,000 blocks, packed by size and in time order")
)

// policyTrace is one trace of the table.
type policyTrace struct {
	name, what string
	synthetic  bool
	ops        func(t testing.TB) []trace.Op
}

func fileOps(path string) func(t testing.TB) []trace.Op {
	return func(t testing.TB) []trace.Op {
		ops, err := trace.ReadFile(path)
		require.NoError(t, err, path)
		require.NotEmpty(t, ops, path)
		return ops
	}
}

func policyTraces() []policyTrace {
	const td = "../trace/replay/testdata/"
	return []policyTrace{
		{"random_mixed", "202,032 random ops, 512 B to 512 MiB, ~2,000 live", true, fileOps(td + "pytorch/random_mixed.trace.gz")},
		{"cs336", "real: 12-layer d768 transformer, forward + backward (also the cs336 snapshot, converted: the same ops)", false, fileOps(td + "pytorch/pub_cs336_MAGMA27_lm_fwdbwd.trace.gz")},
		{"bert_b2", "real: BERT-base training, batch 2, AdamW, 3 steps", false, fileOps(td + "bert_b2.trace.gz")},
		{"bert_b4", "real: the same at batch 4", false, fileOps(td + "bert_b4.trace.gz")},
		{"bert_b8", "real: the same at batch 8", false, fileOps(td + "bert_b8.trace.gz")},
		{"eor_cnn", "real: CNN with Adam, many tiny blocks (EoR_NN snapshot, converted)", false, fileOps(td + "EoR_NN_cnn_counterfactuals.trace.gz")},
		{"bert_b2_x20", "real steps: bert_b2 with its last step repeated to 20 steps", true,
			func(t testing.TB) []trace.Op { return repeatLastStep(fileOps(td+"bert_b2.trace.gz")(t), 20) }},
		{"bert_batches", "real steps: BERT's training step at batches 2, 4 and 8, 20 steps, the batch changing every step", true,
			func(t testing.TB) []trace.Op { return bertBatches(t, 20) }},
		{"bert_train_eval", "real steps: bert_b2's training step, with an evaluation of four steps (its forward pass) before every six training steps, five rounds", true,
			func(t testing.TB) []trace.Op { return bertTrainEval(t, 5) }},
		{"offload", "synthetic: LLaMA-7B-shaped fp16 inference, per-layer weights prefetched on 9 copy streams, compute on stream 0", true,
			func(testing.TB) []trace.Op { return offloadOps(4, 32, 512, 4) }},
		{"kv_legacy", "synthetic: GPT-2-small generation, batch 8, 128 + 384 tokens; the old past_key_values freed after each step", true,
			func(testing.TB) []trace.Op { return kvCacheOps(8, 128, 384, false) }},
		{"kv_dynamic", "synthetic: the same with a DynamicCache: each layer's old K and V freed at once", true,
			func(testing.TB) []trace.Op { return kvCacheOps(8, 128, 384, true) }},
	}
}

// policyModes are the configurations compared.
var policyModes = []struct{ name, conf string }{
	{"faithful default", ""},
	{"faithful expandable", "expandable_segments:True"},
	{"low_fragmentation", "gpumem_policy:low_fragmentation"},
	{"planned", "gpumem_policy:planned"},
}

// measure is what one replay gives.
type measure struct {
	peakReserved, peakRequested int64
	calls                       int64 // num_device_alloc + num_device_free
	events                      int64 // events recorded and waits, on the device (a WaitStream is both)
	deviceTime                  time.Duration
	ooms                        int64
	nsPerOp                     float64
}

func replayPolicy(t testing.TB, ops []trace.Op, cfg allocator.Config, capacity uint64) measure {
	a := gpumemtest.New(t, gpumemtest.WithCapacity(capacity), gpumemtest.WithConfig(cfg), gpumemtest.AllowLeaks())
	dev := a.Device().(*sim.Device)
	res, err := replay.Run(trace.SliceReader(ops), a, dev, replay.Options{})
	require.NoError(t, err)
	require.NoError(t, a.CheckInvariants())
	c := dev.Counters()
	return measure{
		peakReserved: res.PeakReserved, peakRequested: res.PeakRequested,
		calls: res.DeviceAllocs + res.DeviceFrees, events: c.EventsRecorded + c.EventWaits + 2*c.StreamWaits,
		deviceTime: dev.Clock(), ooms: res.OOMs, nsPerOp: res.NsPerOp,
	}
}

// smallestCard bisects the device capacity, in 2 MiB steps, for the
// smallest one on which the replay has no out-of-memory error. hi must
// be enough (the uncapped peak reserved), lo not (below the live bytes).
func smallestCard(t testing.TB, ops []trace.Op, cfg allocator.Config, lo, hi uint64) uint64 {
	const step = 2 << 20
	lo, hi = lo/step*step, (hi+step-1)/step*step
	for replayPolicy(t, ops, cfg, hi).ooms != 0 {
		hi *= 2
	}
	for hi-lo > step {
		mid := (lo + hi) / 2 / step * step
		if replayPolicy(t, ops, cfg, mid).ooms == 0 {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// liveBound is the peak of live requests rounded up to 512 bytes: no
// allocator that rounds as PyTorch does can reserve less.
func liveBound(ops []trace.Op) int64 {
	live := map[uint64]int64{}
	var cur, peak int64
	for _, op := range ops {
		switch op.Kind {
		case trace.Alloc:
			n := int64((op.Size + 511) / 512 * 512)
			live[op.ID] = n
			cur += n
			peak = max(peak, cur)
		case trace.Free:
			cur -= live[op.ID]
			delete(live, op.ID)
		}
	}
	return peak
}

func fastest(xs []float64) float64 { return slices.Min(xs) }

// TestPolicyTable prints POLICY.md's table with -policy.table, and writes
// the synthetic traces with -policy.write.
func TestPolicyTable(t *testing.T) {
	if *policyWrite != "" {
		for _, tr := range policyTraces() {
			if !tr.synthetic || tr.name == "random_mixed" {
				continue
			}
			path := filepath.Join(*policyWrite, tr.name+".trace.gz")
			w, err := trace.Create(path, "synthetic "+tr.name+": "+tr.what)
			require.NoError(t, err)
			for _, op := range tr.ops(t) {
				require.NoError(t, w.Write(op))
			}
			require.NoError(t, w.Close())
			t.Logf("wrote %s", path)
		}
	}
	if !*policyTable {
		t.Skip("measurements: run with -policy.table")
	}
	var b strings.Builder
	fmt.Fprintln(&b, "| trace | mode | peak reserved / peak requested | smallest card / peak requested | device calls | ns/op | event calls | simulated device time |")
	fmt.Fprintln(&b, "| --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, tr := range policyTraces() {
		ops := tr.ops(t)
		bound := liveBound(ops)
		var requested int64
		for i, m := range policyModes {
			cfg, err := allocator.ParseConf(m.conf)
			require.NoError(t, err)
			var ns []float64
			var got measure
			for range max(*policyRuns, 1) {
				got = replayPolicy(t, ops, cfg, 80<<30)
				ns = append(ns, got.nsPerOp)
			}
			if i == 0 {
				requested = got.peakRequested
			}
			card := smallestCard(t, ops, cfg, uint64(bound)-1, uint64(got.peakReserved))
			ratio := float64(got.peakReserved) / float64(got.peakRequested)
			fmt.Fprintf(&b, "| %s | %s | %.3f | %.3f | %d | %.0f | %d | %v |\n", tr.name, m.name, ratio,
				float64(card)/float64(got.peakRequested), got.calls, fastest(ns), got.events, got.deviceTime.Round(time.Millisecond))
		}
		const page = 2 << 20
		if plan, err := offline.Pack(ops); err == nil {
			fp := int64(plan.Footprint)
			fmt.Fprintf(&b, "| %s | offline best | %.3f | %.3f | | | | |\n", tr.name, float64(fp)/float64(requested),
				float64((fp+page-1)/page*page)/float64(requested))
		}
		fmt.Fprintf(&b, "| %s | bound | %.3f | %.3f | | | | |\n", tr.name, float64(bound)/float64(requested),
			float64((bound+page-1)/page*page)/float64(requested))
	}
	t.Logf("table (%s):\n%s", time.Now().Format(time.DateOnly), b.String())
}

// TestPolicyTimes prints, with -policy.times N, each mode's replay time
// as a multiple of the faithful default's: the fastest of N replays,
// the modes taking turns in each round, so that a machine shared with
// other work slows them alike and the fastest replay is the least
// disturbed. Each replay starts after a garbage collection, so that
// none pays for collecting what the replays before it left: with the
// modes in a fixed order, a collection can fall in the same mode's
// replay round after round (without it, two runs in three gave one
// planned BERT replay of about 1 ms a fastest of 1.3 x).
func TestPolicyTimes(t *testing.T) {
	if *policyTimes <= 0 {
		t.Skip("measurements: run with -policy.times N")
	}
	var b strings.Builder
	b.WriteString("| trace |")
	for _, m := range policyModes {
		b.WriteString(" " + m.name + " |")
	}
	b.WriteString("\n| --- |" + strings.Repeat(" --- |", len(policyModes)) + "\n")
	for _, tr := range policyTraces() {
		ops := tr.ops(t)
		best := make([]time.Duration, len(policyModes))
		for r := range *policyTimes {
			for i, m := range policyModes {
				if d, _ := timedReplay(t, ops, m.conf); r == 0 || d < best[i] {
					best[i] = d
				}
			}
		}
		fmt.Fprintf(&b, "| %s | %.2f ms |", tr.name, float64(best[0].Microseconds())/1000)
		for _, d := range best[1:] {
			fmt.Fprintf(&b, " %.2f x |", float64(d)/float64(best[0]))
		}
		b.WriteString("\n")
	}
	t.Logf("fastest of %d replays, as a multiple of the faithful default's:\n%s", *policyTimes, b.String())
}

// timedReplay replays ops on a new simulated device under the
// configuration conf, after a collection of the Go heap, and returns the
// replay's wall time and the allocator.
func timedReplay(t *testing.T, ops []trace.Op, conf string) (time.Duration, *allocator.Allocator) {
	cfg, err := allocator.ParseConf(conf)
	require.NoError(t, err)
	dev := simtest.New(t)
	a, err := allocator.New(dev, cfg)
	require.NoError(t, err)
	runtime.GC()
	start := time.Now()
	_, err = replay.Run(trace.SliceReader(ops), a, dev, replay.Options{})
	d := time.Since(start)
	require.NoError(t, err)
	return d, a
}

// TestPlannedStepsToPayBack measures, with -policy.steps N, how many
// steps the planned policy takes to pay back its plans in time: bert_b2
// with its last step repeated, and BERT's batches that change every step
// (bertBatches), over more and more steps, each replayed N rounds under
// the faithful default and the planned policy in turns; it prints the
// fastest replay of each and planned's as a multiple of the default's.
// Each replay checks what the plans served: every repeated step after
// the third, from its first plan on.
func TestPlannedStepsToPayBack(t *testing.T) {
	if *policySteps <= 0 {
		t.Skip("measurements: run with -policy.steps N")
	}
	repeated := fileOps("../trace/replay/testdata/bert_b2.trace.gz")(t)
	var b strings.Builder
	b.WriteString("| trace | steps | faithful default | planned | planned / default | requests served |\n| --- | --- | --- | --- | --- | --- |\n")
	for _, w := range []struct {
		name  string
		ops   func(steps int) []trace.Op
		whole bool // every step after the third is served whole
	}{
		{"bert_b2 repeated", func(steps int) []trace.Op { return repeatLastStep(repeated, steps) }, true},
		{"bert_batches", func(steps int) []trace.Op { return bertBatches(t, steps) }, false},
	} {
		for _, steps := range []int{20, 30, 40, 60, 100, 200} {
			ops := w.ops(steps)
			var best [2]time.Duration
			var served int64
			for r := range *policySteps {
				for i, conf := range []string{"", "gpumem_policy:planned"} {
					d, a := timedReplay(t, ops, conf)
					if r == 0 || d < best[i] {
						best[i] = d
					}
					if st, ok := a.PlanStats(); ok {
						served = st.Served
					}
				}
			}
			if w.whole {
				require.Equal(t, int64(steps-3)*1004, served, "%d steps: every step after the third served whole", steps)
			} else {
				require.Positive(t, served, "%d steps", steps)
			}
			fmt.Fprintf(&b, "| %s | %d | %.2f ms | %.2f ms | %.3f | %d |\n", w.name, steps,
				float64(best[0].Microseconds())/1000, float64(best[1].Microseconds())/1000, float64(best[1])/float64(best[0]), served)
		}
	}
	t.Logf("fastest of %d replays:\n%s", *policySteps, b.String())
}

// BenchmarkPolicyReplay replays each trace under each mode, side by side
// in one run: ns per trace op (the allocator and the replay's
// bookkeeping), peak reserved / peak requested and device calls.
func BenchmarkPolicyReplay(b *testing.B) {
	for _, tr := range policyTraces() {
		ops := tr.ops(b)
		for _, m := range policyModes {
			cfg, err := allocator.ParseConf(m.conf)
			require.NoError(b, err)
			b.Run(tr.name+"/"+strings.ReplaceAll(m.name, " ", "_"), func(b *testing.B) {
				var got measure
				for b.Loop() {
					b.StopTimer()
					dev := simtest.New(b)
					a, _ := allocator.New(dev, cfg)
					b.StartTimer()
					res, err := replay.Run(trace.SliceReader(ops), a, dev, replay.Options{})
					if err != nil {
						b.Fatal(err)
					}
					got = measure{peakReserved: res.PeakReserved, peakRequested: res.PeakRequested, calls: res.DeviceAllocs + res.DeviceFrees}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(ops)), "ns/trace-op")
				b.ReportMetric(float64(got.peakReserved)/float64(got.peakRequested), "reserved/requested")
				b.ReportMetric(float64(got.calls), "device-calls")
			})
		}
	}
}

// BenchmarkPolicyBatches replays BERT's training steps at batches that
// change every step (bertBatches) over 20 and 100 steps, under the
// faithful default and the planned policy, whose plans of the steps'
// envelope a longer run amortizes.
func BenchmarkPolicyBatches(b *testing.B) {
	for _, steps := range []int{20, 100} {
		ops := bertBatches(b, steps)
		for _, m := range []struct{ name, conf string }{{"faithful_default", ""}, {"planned", "gpumem_policy:planned"}} {
			cfg, err := allocator.ParseConf(m.conf)
			require.NoError(b, err)
			b.Run(fmt.Sprintf("steps=%d/%s", steps, m.name), func(b *testing.B) {
				for b.Loop() {
					b.StopTimer()
					dev := simtest.New(b)
					a, _ := allocator.New(dev, cfg)
					b.StartTimer()
					if _, err := replay.Run(trace.SliceReader(ops), a, dev, replay.Options{}); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*steps), "ns/step")
			})
		}
	}
}

// policyVariants change one part of the policy each.
var policyVariants = []struct{ name, conf string }{
	{"policy", ""},
	{"plain best fit", "gpumem_fit_window:1"},
	{"no reclaim", "gpumem_reclaim:False"},
	{"reclaim: any number of victims", "gpumem_reclaim_victims:1000000"},
	{"reclaim: recent blocks too", "gpumem_reclaim_min_age:1"},
	{"slack 0.03", "gpumem_reclaim_slack:0.03"},
	{"slack 0.05", "gpumem_reclaim_slack:0.05"},
	{"no map-ahead", "gpumem_map_ahead_mb:1"},
	{"20 MiB large pages", "gpumem_large_page_mb:20"},
	{"no lending", "gpumem_cross_stream:False"},
	{"size classes (1/16 power of two)", "roundup_power2_divisions:[1:1,2:16,>:16]"},
}

// TestPolicyParts prints, with -policy.parts, peak reserved / peak
// requested and device calls of every trace under the policy with each
// part changed.
func TestPolicyParts(t *testing.T) {
	if !*policyParts {
		t.Skip("measurements: run with -policy.parts")
	}
	traces := policyTraces()
	var b strings.Builder
	b.WriteString("| variant |")
	for _, tr := range traces {
		b.WriteString(" " + tr.name + " |")
	}
	b.WriteString("\n| --- |" + strings.Repeat(" --- |", len(traces)) + "\n")
	ops := make([][]trace.Op, len(traces))
	for i, tr := range traces {
		ops[i] = tr.ops(t)
	}
	for _, v := range policyVariants {
		conf := "gpumem_policy:low_fragmentation"
		if v.conf != "" {
			conf += "," + v.conf
		}
		cfg, err := allocator.ParseConf(conf)
		require.NoError(t, err)
		fmt.Fprintf(&b, "| %s |", v.name)
		for i := range traces {
			got := replayPolicy(t, ops[i], cfg, 80<<30)
			fmt.Fprintf(&b, " %.3f / %d |", float64(got.peakReserved)/float64(got.peakRequested), got.calls)
		}
		b.WriteString("\n")
	}
	t.Logf("peak reserved / peak requested, device calls:\n%s", b.String())
}
