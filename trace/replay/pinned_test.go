package replay

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
)

var updatePinned = flag.Bool("pinned.update", false, "rewrite testdata/pinned from the current code (after checking that a change of decisions is meant)")

// pinned is what TestDecisionsPinned compares: every count of a replay
// that an allocation decision moves.
type pinned struct {
	Ops           int64            `json:"ops"`
	Allocs        int64            `json:"allocs"`
	OOMs          int64            `json:"ooms"`
	PeakRequested int64            `json:"peak_requested_bytes"`
	PeakAllocated int64            `json:"peak_allocated_bytes"`
	PeakReserved  int64            `json:"peak_reserved_bytes"`
	DeviceAllocs  int64            `json:"device_allocs"`
	DeviceFrees   int64            `json:"device_frees"`
	Stats         map[string]int64 `json:"stats"`
}

// TestDecisionsPinned pins gpumem's decisions where no PyTorch
// expectation does (TestFidelityWithPyTorch pins the default and
// max_split_size modes): expandable segments, with and without
// max_split_size, and the low_fragmentation policy, on four traces, with
// room to spare and on a device small enough that the out-of-memory
// ladder runs. The files in testdata/pinned were written by this code
// (-pinned.update) when the index of expandable segments moved from a
// B+ tree to size classes, after every stat of `gpumem replay` was found
// identical between the two on these traces and more; a change that
// moves a segment, a page or a device call in these modes shows up here.
func TestDecisionsPinned(t *testing.T) {
	traces := []string{
		"testdata/random_mixed_2000.trace.gz",
		"testdata/bert_b2.trace.gz",
		"testdata/EoR_NN_cnn_counterfactuals.trace.gz",
		"testdata/pytorch/pub_cs336_MAGMA27_lm_fwdbwd.trace.gz",
	}
	confs := []struct{ name, conf string }{
		{"expandable", "expandable_segments:True"},
		{"expandable_split128", "expandable_segments:True,max_split_size_mb:128"},
		{"policy", "gpumem_policy:low_fragmentation"},
	}
	capacities := []uint64{80 << 30, 1500 << 20}
	for _, path := range traces {
		for _, c := range confs {
			for _, capacity := range capacities {
				name := fmt.Sprintf("%s.%s.%dMiB", strings.SplitN(filepath.Base(path), ".", 2)[0], c.name, capacity>>20)
				t.Run(name, func(t *testing.T) {
					cfg, err := allocator.ParseConf(c.conf)
					require.NoError(t, err)
					res, a := replayConf(t, path, cfg, capacity)
					require.NoError(t, a.CheckInvariants())
					got := pinned{res.Ops, res.Alloc, res.OOMs, res.PeakRequested, res.PeakAllocated, res.PeakReserved, res.DeviceAllocs, res.DeviceFrees, res.Stats}
					file := filepath.Join("testdata/pinned", name+".json")
					if *updatePinned {
						b, err := json.MarshalIndent(got, "", "\t")
						require.NoError(t, err)
						require.NoError(t, os.MkdirAll(filepath.Dir(file), 0o755))
						require.NoError(t, os.WriteFile(file, append(b, '\n'), 0o644))
						return
					}
					b, err := os.ReadFile(file)
					require.NoError(t, err, "no pinned figures: run with -pinned.update once the decisions are checked")
					var want pinned
					require.NoError(t, json.Unmarshal(b, &want))
					assert.Equal(t, want, got)
				})
			}
		}
	}
}
