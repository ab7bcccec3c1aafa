package main

// The workload behind default.pgo, the CPU profile that `go build` and
// `go install` of this command apply (profile-guided optimization: with
// Go's default -pgo=auto, a main package's default.pgo guides the
// inlining and devirtualization of the whole program). scripts/pgo.sh
// profiles TestProfileWorkload into it; a stale profile costs some of the
// gain, never correctness.

import (
	"flag"
	"io"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

var pgoWorkload = flag.Bool("pgo.workload", false, "run the workload that scripts/pgo.sh profiles into default.pgo")

// TestProfileWorkload runs what users run most: replays of the shared
// traces (gzipped, of one stream and of ten), 300 of each by PyTorch's
// default and one by the low_fragmentation policy. fit, compare, scale
// and tune replay too; compare's and fit's offline packing, a loop
// without calls, is left out, as it would take most of the samples and
// gains nothing from a profile.
func TestProfileWorkload(t *testing.T) {
	if !*pgoWorkload {
		t.Skip("the profile's workload runs with -pgo.workload (scripts/pgo.sh)")
	}
	clearConfEnv(t)
	traces, err := filepath.Glob("../../trace/replay/testdata/*.trace.gz")
	require.NoError(t, err)
	more, err := filepath.Glob("../../trace/replay/testdata/pytorch/*.trace.gz")
	require.NoError(t, err)
	traces = append(traces, more...)
	require.NotEmpty(t, traces)
	var runs [][]string
	for _, tr := range traces {
		for range 300 {
			runs = append(runs, []string{"replay", "--json", tr})
		}
		runs = append(runs, []string{"replay", "--json", "--conf", "gpumem_policy:low_fragmentation", tr})
	}
	for _, args := range runs {
		require.Zero(t, run(args, io.Discard, io.Discard), "%q", args)
	}
}
