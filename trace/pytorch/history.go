// This file holds History, which records an allocator's events the way
// PyTorch's memory history does and writes PyTorch-format snapshots.

package pytorch

import (
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/stats"
)

// History records what an allocator does as PyTorch's
// torch.cuda.memory._record_memory_history does: a ring buffer of the last
// entries (alloc, free_requested, free_completed, segment_alloc,
// segment_free, segment_map, segment_unmap, oom), each with its address,
// size, stream and time. Attach it with Allocator.Attach. WriteSnapshot
// then writes a snapshot in the format of
// torch.cuda.memory._dump_snapshot, which PyTorch's memory visualizer
// (https://pytorch.org/memory_viz) and ReadSnapshot open. Stack frames are
// not recorded (the lists are empty). History is safe for concurrent use.
type History struct {
	mu      sync.Mutex // guards everything below
	entries []historyEntry
	next    int // where the next entry goes once the ring is full
	max     int
}

type historyEntry struct {
	action string
	addr   uint64
	size   uint64
	stream uint64
	timeUs int64
}

// NewHistory returns a History that keeps the last maxEntries entries (all
// of them when maxEntries is 0 or less).
func NewHistory(maxEntries int) *History {
	return &History{max: maxEntries}
}

// Observe implements allocator.Observer.
func (h *History) Observe(e allocator.Action) {
	var action string
	size := e.Size
	switch e.Kind {
	case allocator.ActionAlloc:
		action, size = "alloc", e.Requested
	case allocator.ActionFreeRequested:
		action, size = "free_requested", e.Requested
	case allocator.ActionFreeCompleted:
		action, size = "free_completed", e.Requested
	case allocator.ActionSegmentAlloc:
		action = "segment_alloc"
	case allocator.ActionSegmentFree:
		action = "segment_free"
	case allocator.ActionSegmentMap:
		action = "segment_map"
	case allocator.ActionSegmentUnmap:
		action = "segment_unmap"
	case allocator.ActionOutOfMemory:
		action, size = "oom", e.Size
	default:
		return // no PyTorch counterpart
	}
	en := historyEntry{action: action, addr: uint64(e.Ptr), size: size, stream: uint64(e.Stream), timeUs: time.Now().UnixMicro()}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.max > 0 && len(h.entries) == h.max {
		h.entries[h.next] = en
		h.next = (h.next + 1) % h.max
		return
	}
	h.entries = append(h.entries, en)
}

// Entries returns the number of entries kept.
func (h *History) Entries() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.entries)
}

// WriteSnapshot writes a PyTorch-format memory snapshot (a pickle of a
// dict with segments, device_traces and allocator_settings) of a's
// current segments and the recorded history, oldest entry first.
func (h *History) WriteSnapshot(w io.Writer, a *allocator.Allocator) error {
	h.mu.Lock()
	ordered := append(append([]historyEntry(nil), h.entries[h.next:]...), h.entries[:h.next]...)
	h.mu.Unlock()

	ordinal := a.Device().Ordinal()
	var segs []any
	for _, s := range a.Snapshot() {
		var blocks []any
		for _, b := range s.Blocks {
			blocks = append(blocks, pdict{
				{"address", uint64(b.Ptr)}, {"size", b.Size}, {"requested_size", b.Requested},
				{"state", b.State.String()}, {"frames", []any{}},
			})
		}
		kind := "large"
		if s.Pool == stats.SmallPool {
			kind = "small"
		}
		segs = append(segs, pdict{
			{"device", ordinal}, {"address", uint64(s.Ptr)}, {"total_size", s.Size},
			{"allocated_size", s.Allocated}, {"active_size", s.Active}, {"requested_size", s.Requested},
			{"stream", uint64(s.Stream)}, {"segment_type", kind}, {"segment_pool_id", ptuple{0, 0}},
			{"is_expandable", s.Expandable}, {"frames", []any{}}, {"blocks", blocks},
		})
	}
	var trace []any
	for _, e := range ordered {
		addrKey := "addr"
		if e.action == "oom" {
			addrKey = "device_free" // PyTorch puts the device's free bytes here
		}
		trace = append(trace, pdict{
			{"action", e.action}, {addrKey, e.addr}, {"size", e.size}, {"stream", e.stream},
			{"time_us", e.timeUs}, {"compile_context", "N/A"}, {"user_metadata", ""}, {"frames", []any{}},
		})
	}
	traces := make([]any, ordinal+1)
	for i := range traces {
		traces[i] = []any{}
	}
	traces[ordinal] = trace

	cfg := a.Config()
	maxSplit := int64(-1)
	if cfg.MaxSplitSize != 0 {
		maxSplit = int64(cfg.MaxSplitSize)
	}
	roundup := pdict{}
	for i, d := range cfg.RoundupPower2Divisions {
		roundup = append(roundup, pkv{strconv.Itoa(1 << i), d})
	}
	snapshot := pdict{
		{"segments", segs},
		{"device_traces", traces},
		{"allocator_settings", pdict{
			{"PYTORCH_CUDA_ALLOC_CONF", cfg.String()},
			{"max_split_size", maxSplit},
			{"garbage_collection_threshold", cfg.GarbageCollectionThreshold},
			{"expandable_segments", cfg.ExpandableSegments},
			{"roundup_power2_divisions", roundup},
		}},
		{"external_annotations", []any{}},
	}
	data, err := encodePickle(snapshot)
	if err != nil {
		return err
	}
	_, err = w.Write(data)
	return err
}
