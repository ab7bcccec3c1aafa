// Runnable examples of the pytorch package.

package pytorch_test

import (
	"bytes"
	"fmt"
	"os"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/stats"
	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/pytorch"
	"github.com/gpumem/gpumem/trace/replay"
)

// Record an allocator's history as PyTorch's
// torch.cuda.memory._record_memory_history does, and write a snapshot that
// PyTorch's memory visualizer opens (https://pytorch.org/memory_viz). Here
// the snapshot is read back and printed as memtrace: the block still live
// at the end is freed after the history window.
func ExampleHistory() {
	dev, _ := sim.New(sim.Config{})
	a, _ := allocator.New(dev, allocator.Config{})
	h := pytorch.NewHistory(1000) // keep the last 1000 entries
	detach := a.Attach(h)

	x, _ := a.Alloc(3<<20, device.DefaultStream)
	y, _ := a.Alloc(1024, device.DefaultStream)
	a.Free(x)
	_ = y // still live when the snapshot is taken

	detach()
	fmt.Println("entries:", h.Entries())
	var snapshot bytes.Buffer // a file for the visualizer, in a real program
	if err := h.WriteSnapshot(&snapshot, a); err != nil {
		fmt.Println(err)
		return
	}

	im, err := pytorch.ReadSnapshot(&snapshot, pytorch.SnapshotOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	w := trace.NewWriter(os.Stdout, "source=history")
	if err := im.WriteOps(w); err != nil {
		fmt.Println(err)
	}
	w.Close()
	// Output:
	// entries: 6
	// # memtrace v1 source=history
	// a 0 3145728 0
	// a 1 1024 0
	// f 0
	// # end of history window: 1 blocks still alive, freed below
	// f 1
}

// Import a PyTorch memory snapshot (torch.cuda.memory._dump_snapshot's
// pickle) of a real training step: its history is a window of the run, so
// the blocks allocated before it are allocated up front.
func ExampleReadSnapshot() {
	f, err := os.Open("testdata/cs336_MAGMA27_lm_fwdbwd.noframes.pickle.gz")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer f.Close()
	im, err := pytorch.ReadSnapshot(f, pytorch.SnapshotOptions{Device: 0})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%d entries, %d ops\n", im.Events, len(im.Ops))
	fmt.Printf("before the window: %d blocks (%d freed in it, %d alive at the snapshot)\n",
		im.WindowStart, im.PreWindowFreed, im.PreWindowLive)
	fmt.Println("first op of the window:", im.Ops[im.WindowStart])
	fmt.Println("ignored entries:", im.Ignored)
	// Output:
	// 5163 entries, 3900 ops
	// before the window: 229 blocks (2 freed in it, 227 alive at the snapshot)
	// first op of the window: a 229 25165824 0
	// ignored entries: map[free_requested:1721]
}

// Write a snapshot of the state at the peak of a trace's replay, not at
// its end (when everything is freed): replay once to find after how many
// ops allocated memory peaked, then again, with a History, up to there.
// The simulated device is deterministic, so the second replay reaches the
// same state.
func ExampleHistory_atPeak() {
	replayTo := func(opt replay.Options, h *pytorch.History) (*replay.Result, *allocator.Allocator, error) {
		r, err := trace.Open("testdata/pub_cs336_MAGMA27_lm_fwdbwd.trace.gz")
		if err != nil {
			return nil, nil, err
		}
		defer r.Close()
		dev, _ := sim.New(sim.Config{})
		a, _ := allocator.New(dev, allocator.Config{})
		if h != nil {
			defer a.Attach(h)()
		}
		res, err := replay.Run(r, a, dev, opt)
		return res, a, err
	}
	full, _, err := replayTo(replay.Options{Peak: true}, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("peak: %d bytes allocated after op %d of %d (line %d)\n", full.PeakAllocated, full.PeakOp, full.Ops, full.PeakLine)

	h := pytorch.NewHistoryWith(pytorch.HistoryOptions{MaxEntries: 100000})
	_, a, err := replayTo(replay.Options{StopAfter: full.PeakOp}, h)
	if err != nil {
		fmt.Println(err)
		return
	}
	var snapshot bytes.Buffer // a file for the visualizer, in a real program
	if err := h.WriteSnapshot(&snapshot, a); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("allocated when the snapshot was written:", a.Stats().AllocatedBytes[stats.All].Current)
	// Output:
	// peak: 13926947328 bytes allocated after op 1256 of 3900 (line 1262)
	// allocated when the snapshot was written: 13926947328
}
