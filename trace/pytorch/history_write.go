// This file holds History.WriteSnapshot: the recorded entries, the
// allocator's segments and its settings as a PyTorch snapshot pickle.

package pytorch

import (
	"io"
	"maps"
	"strconv"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/stats"
	"github.com/gpumem/gpumem/trace/internal/callsite"
)

// unknownCategory is the category of what has no phase. PyTorch's memory
// visualizer colors the blocks that the history never saw allocated with
// it, and fails to open a snapshot whose entries have categories but not
// this one; the snapshot entry at the end of every written trace carries
// it, so that it is always there.
const unknownCategory = "unknown"

// WriteSnapshot writes a PyTorch-format memory snapshot (a pickle of a
// dict with segments, device_traces, allocator_settings and
// external_annotations) of a's current segments and the recorded history,
// oldest entry first. Like torch.cuda.memory._snapshot, it first records a
// snapshot entry (address 0, the active bytes as its size), which ends the
// trace it writes and stays in the History.
//
// Each entry carries its phase (allocator.SetPhase; for an alloc or free,
// the block's phase) twice: as user_metadata, the entry's free-form string
// in PyTorch's format, and, when any written entry has a phase, as
// category, which the visualizer's Active Memory Timeline colors
// allocations by, with a legend of the categories (those without a phase
// are "unknown"). With HistoryOptions.Stacks, every entry, every active
// block (the stack of its allocation) and every segment (that of its
// device allocation) has the frames of its Go call stack, innermost first,
// as {"name", "filename", "line"}; otherwise, and for blocks the History
// did not see allocated, the frame lists are empty (the visualizer says
// the block was allocated before history was recorded). Frames and the
// frame lists of equal stacks are one shared object in the pickle.
func (h *History) WriteSnapshot(w io.Writer, a *allocator.Allocator) error {
	// a.Snapshot takes the allocator's locks, which are held while Observe
	// takes h.mu: read the segments before locking h.
	segments := a.Snapshot()
	var active uint64
	for _, s := range segments {
		active += s.Active
	}
	h.mu.Lock()
	h.addLocked(historyEntry{action: "snapshot", size: active, timeUs: nowUs(), phase: h.phase})
	ordered := append(append([]historyEntry(nil), h.entries[h.next:]...), h.entries[:h.next]...)
	st := stackTable{pcs: h.stackPCs[:len(h.stackPCs):len(h.stackPCs)]} // stacks are never changed once kept
	live, segStacks := maps.Clone(h.live), maps.Clone(h.segs)
	h.mu.Unlock()

	ordinal := a.Device().Ordinal()
	var segs []any
	for _, s := range segments {
		var blocks []any
		for _, b := range s.Blocks {
			var frames any = st.empty()
			if b.State != allocator.BlockFree {
				frames = st.frames(live[b.Ptr])
			}
			blocks = append(blocks, pdict{
				{"address", uint64(b.Ptr)}, {"size", b.Size}, {"requested_size", b.Requested},
				{"state", b.State.String()}, {"frames", frames},
			})
		}
		kind := "large"
		if s.Pool == stats.SmallPool {
			kind = "small"
		}
		segs = append(segs, pdict{
			{"device", ordinal}, {"address", uint64(s.Ptr)}, {"total_size", s.Size},
			{"allocated_size", s.Allocated}, {"active_size", s.Active}, {"requested_size", s.Requested},
			{"stream", uint64(s.Stream)}, {"segment_type", kind}, {"segment_pool_id", ptuple{0, s.PoolID}},
			{"is_expandable", s.Expandable}, {"frames", st.frames(segStacks[s.Ptr])}, {"blocks", blocks},
		})
	}

	categories := false
	for _, e := range ordered {
		categories = categories || e.phase != ""
	}
	var trace []any
	for _, e := range ordered {
		addrKey := "addr"
		if e.action == "oom" {
			addrKey = "device_free" // PyTorch puts the device's free bytes here
		}
		entry := pdict{
			{"action", e.action}, {addrKey, e.addr}, {"size", e.size}, {"stream", e.stream},
			{"time_us", e.timeUs}, {"compile_context", "N/A"}, {"user_metadata", e.phase},
			{"frames", st.frames(e.stack)},
		}
		if categories {
			c := e.phase
			if c == "" || e.action == "snapshot" {
				c = unknownCategory
			}
			entry = append(entry, pkv{"category", c})
		}
		trace = append(trace, entry)
	}
	traces := make([]any, ordinal+1)
	for i := range traces {
		traces[i] = []any{}
	}
	traces[ordinal] = trace

	snapshot := pdict{
		{"segments", segs},
		{"device_traces", traces},
		{"allocator_settings", settings(a.Config())},
		{"external_annotations", []any{}},
	}
	data, err := encodePickle(snapshot)
	if err != nil {
		return err
	}
	_, err = w.Write(data)
	return err
}

// settings is the snapshot's allocator_settings dict.
func settings(cfg allocator.Config) pdict {
	maxSplit := int64(-1)
	if cfg.MaxSplitSize != 0 {
		maxSplit = int64(cfg.MaxSplitSize)
	}
	roundup := pdict{}
	for i, d := range cfg.RoundupPower2Divisions {
		roundup = append(roundup, pkv{strconv.Itoa(1 << i), d})
	}
	return pdict{
		{"PYTORCH_CUDA_ALLOC_CONF", cfg.String()},
		{"max_split_size", maxSplit},
		{"garbage_collection_threshold", cfg.GarbageCollectionThreshold},
		{"expandable_segments", cfg.ExpandableSegments},
		{"roundup_power2_divisions", roundup},
	}
}

// stackTable turns kept stacks into the snapshot's frame lists, each
// distinct stack and frame once.
type stackTable struct {
	pcs     [][]uintptr // by stack ID; 0 is no stack
	symbols callsite.Cache
	lists   map[int32]any
	frame   map[callsite.Frame]*pshared
}

// empty returns an empty frame list: written out, it costs less than a
// reference to a shared one.
func (t *stackTable) empty() any { return []any{} }

// frames returns the frame list of stack id: {"name", "filename", "line"}
// dicts, innermost first, as PyTorch writes them.
func (t *stackTable) frames(id int32) any {
	if id <= 0 || int(id) >= len(t.pcs) {
		return t.empty()
	}
	if l, ok := t.lists[id]; ok {
		return l
	}
	if t.lists == nil {
		t.lists = make(map[int32]any)
		t.frame = make(map[callsite.Frame]*pshared)
	}
	var list []any
	for _, f := range t.symbols.Stack(t.pcs[id]) {
		d, ok := t.frame[f]
		if !ok {
			d = &pshared{v: pdict{{"name", f.Function}, {"filename", f.File}, {"line", f.Line}}}
			t.frame[f] = d
		}
		list = append(list, d)
	}
	var l any = &pshared{v: list}
	if list == nil {
		l = t.empty()
	}
	t.lists[id] = l
	return l
}
