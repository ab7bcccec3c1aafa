package plan

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/internal/tracetest"
)

func TestSweep(t *testing.T) {
	s := Sweep()
	require.Greater(t, len(s), 2)
	assert.Equal(t, "", s[0].Conf, "PyTorch's default first")
	assert.Equal(t, "expandable_segments:True", s[1].Conf, "expandable_segments alone second")
	seen := map[string]bool{}
	for _, c := range s {
		assert.False(t, seen[c.Conf], "%q twice", c.Conf)
		seen[c.Conf] = true
		back, err := allocator.ParseConf(c.Conf)
		require.NoError(t, err)
		assert.Equal(t, back, c.Config)
	}
	assert.True(t, seen["expandable_segments:True,max_split_size_mb:128,roundup_power2_divisions:8,garbage_collection_threshold:0.8,per_process_memory_fraction:1"])
	assert.True(t, seen["gpumem_policy:low_fragmentation"], "gpumem's own policy is swept too")
}

func TestTune(t *testing.T) {
	for _, c := range []struct {
		path  string
		ops   []trace.Op
		cands []Candidate
	}{
		{"nonMonotone", parse(t, nonMonotone), Sweep()},
		{smallTrace, tracetest.ReadFile(t, smallTrace), Sweep()[:8]},
		{"bert_b2", tracetest.ReadFile(t, "testdata/batches/bert_b2.trace.gz"), Sweep()[:4]},
	} {
		path, ops := c.path, c.ops
		var calls []int
		res, err := Tune(ops, TuneOptions{Jobs: 2, Candidates: c.cands, Progress: func(done, total int) {
			assert.Equal(t, len(c.cands), total)
			calls = append(calls, done)
		}})
		require.NoError(t, err)
		require.Len(t, res, len(c.cands))
		assert.Len(t, calls, len(res), "one progress call per configuration")
		assert.Equal(t, len(res), calls[len(calls)-1])

		byConf := map[string]TuneResult{}
		for i, r := range res {
			byConf[r.Conf] = r
			if i > 0 {
				prev := res[i-1]
				if prev.AtCapacity.OOMs == 0 && r.AtCapacity.OOMs > 0 {
					continue // out of memory on the capacity: last
				}
				assert.LessOrEqual(t, prev.Fit.MinCapacity, r.Fit.MinCapacity, "ranked by the smallest capacity first")
				if prev.Fit.MinCapacity == r.Fit.MinCapacity {
					assert.LessOrEqual(t, prev.AtCapacity.PeakReserved, r.AtCapacity.PeakReserved)
					if prev.AtCapacity.PeakReserved == r.AtCapacity.PeakReserved {
						assert.LessOrEqual(t, prev.DeviceCalls(), r.DeviceCalls())
					}
				}
			}
		}
		best := res[0]
		for _, base := range []string{"", "expandable_segments:True"} {
			b := byConf[base]
			require.NotNil(t, b.Fit, "%q is in the sweep", base)
			// Each configuration's figures are those of its own fit and
			// replay.
			fit, err := Fit(ops, FitOptions{Config: b.Config})
			require.NoError(t, err)
			assert.Equal(t, fit.MinCapacity, b.Fit.MinCapacity, "%s %q", path, base)
			at, err := Replay(ops, b.Config, 0)
			require.NoError(t, err)
			assert.Equal(t, at.PeakReserved, b.AtCapacity.PeakReserved)
			// The best is never worse.
			assert.LessOrEqual(t, best.Fit.MinCapacity, b.Fit.MinCapacity, "%s: best %q against %q", path, best.Conf, base)
			if best.Fit.MinCapacity == b.Fit.MinCapacity {
				assert.LessOrEqual(t, best.AtCapacity.PeakReserved, b.AtCapacity.PeakReserved)
			}
		}
	}
}

func TestTuneJobsAgree(t *testing.T) {
	if selfChecks {
		t.Skip("parallel sweeps against one: the untagged runs (and -race) check it; TestTune replays the same under the self-checks")
	}
	ops := tracetest.ReadFile(t, smallTrace)
	cands := Sweep()[:6]
	one, err := Tune(ops, TuneOptions{Jobs: 1, Candidates: cands, Capacity: 16 << 30})
	require.NoError(t, err)
	two, err := Tune(ops, TuneOptions{Jobs: 2, Candidates: cands, Capacity: 16 << 30})
	require.NoError(t, err)
	for i := range one {
		assert.Equal(t, one[i].Conf, two[i].Conf)
		assert.Equal(t, one[i].Fit.MinCapacity, two[i].Fit.MinCapacity)
		assert.Equal(t, one[i].AtCapacity.Stats, two[i].AtCapacity.Stats)
	}
}

func TestTuneError(t *testing.T) {
	ops := parse(t, "a 1 1024\n")
	cands := []Candidate{{Conf: "expandable_segments:True", Config: allocator.Config{ExpandableSegments: true}}}
	ops = append(ops, ops[0]) // the same ID allocated twice
	_, err := Tune(ops, TuneOptions{Candidates: cands})
	assert.ErrorContains(t, err, "expandable_segments:True: ")
}

func TestPyTorchSetting(t *testing.T) {
	c, err := allocator.ParseConf("roundup_power2_divisions:8,garbage_collection_threshold:0.8,per_process_memory_fraction:1,expandable_segments:True")
	require.NoError(t, err)
	conf, frac, ok := PyTorchSetting(c)
	assert.True(t, ok)
	assert.Equal(t, "roundup_power2_divisions:8,garbage_collection_threshold:0.8,expandable_segments:True", conf)
	assert.Equal(t, 1.0, frac)
	back, err := allocator.ParseConf(conf)
	require.NoError(t, err)
	c.MemoryFraction = 0
	assert.Equal(t, c, back)

	c, err = allocator.ParseConf("roundup_power2_divisions:[256:1,>:4],memory_limit_bytes:1048576")
	require.NoError(t, err)
	conf, frac, ok = PyTorchSetting(c)
	assert.False(t, ok, "PyTorch has no byte limit")
	assert.Zero(t, frac)
	assert.Contains(t, conf, "roundup_power2_divisions:[")
	assert.Equal(t, "", CompactConf(allocator.Config{}))
}

// TestTuneRanksFailuresOnTheDeviceLast: on 70 MiB the non-monotone trace
// fails with PyTorch's default although its smallest capacity, 62 MiB, is
// below; with roundup_power2_divisions:2 it needs 70 MiB and runs there,
// so that configuration ranks first.
func TestTuneRanksFailuresOnTheDeviceLast(t *testing.T) {
	ops := parse(t, nonMonotone)
	var cands []Candidate
	for _, conf := range []string{"", "roundup_power2_divisions:2"} {
		c, err := NewCandidate(conf)
		require.NoError(t, err)
		cands = append(cands, c)
	}
	res, err := Tune(ops, TuneOptions{Capacity: 70 * mib, Candidates: cands})
	require.NoError(t, err)
	assert.Equal(t, "roundup_power2_divisions:2", res[0].Conf)
	assert.EqualValues(t, 70*mib, res[0].Fit.MinCapacity)
	assert.Zero(t, res[0].AtCapacity.OOMs)
	assert.EqualValues(t, 62*mib, res[1].Fit.MinCapacity)
	assert.Positive(t, res[1].AtCapacity.OOMs)
	// On a roomy device the smaller capacity wins.
	res, err = Tune(ops, TuneOptions{Candidates: cands})
	require.NoError(t, err)
	assert.Equal(t, "", res[0].Conf)
}

// A Tune stops the configurations not yet evaluated once its context is
// done.
func TestTuneContextStops(t *testing.T) {
	ops := tracetest.ReadFile(t, smallTrace)
	cands := Sweep()[:4]
	for _, jobs := range []int{1, 3} {
		// Done after the first configuration: the others stop or are
		// skipped.
		ctx, cancel := context.WithCancel(context.Background())
		calls := 0
		_, err := TuneContext(ctx, ops, TuneOptions{Candidates: cands, Jobs: jobs, Progress: func(int, int) {
			calls++
			cancel()
		}})
		require.ErrorIs(t, err, context.Canceled, "jobs=%d", jobs)
		assert.Less(t, calls, len(cands), "jobs=%d", jobs)
		done, cancel := context.WithCancel(context.Background())
		cancel()
		_, err = TuneContext(done, ops, TuneOptions{Candidates: cands, Jobs: jobs, Progress: func(int, int) {
			t.Error("no configuration is evaluated after the context is done")
		}})
		require.ErrorIs(t, err, context.Canceled, "jobs=%d", jobs)
	}
}
