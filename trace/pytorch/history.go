// This file holds History, which records an allocator's events the way
// PyTorch's memory history does and writes PyTorch-format snapshots.

package pytorch

import (
	"encoding/binary"
	"runtime"
	"sync"
	"time"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
)

// History records what an allocator does as PyTorch's
// torch.cuda.memory._record_memory_history does: a ring buffer of the last
// entries (alloc, free_requested, free_completed, segment_alloc,
// segment_free, segment_map, segment_unmap, oom, snapshot), each with its
// address, size, stream, time and phase, and, with HistoryOptions.Stacks,
// the Go call stack that caused it. Attach it with Allocator.Attach.
// WriteSnapshot then writes a snapshot in the format of
// torch.cuda.memory._dump_snapshot, which PyTorch's memory visualizer
// (https://pytorch.org/memory_viz) and ReadSnapshot open. History is safe
// for concurrent use.
type History struct {
	max    int  // entries kept; 0: all
	stacks bool // record call stacks

	mu      sync.Mutex // guards everything below
	entries []historyEntry
	next    int    // where the next entry goes once the ring is full
	phase   string // the allocator's current phase, as last seen

	// With stacks: each distinct stack once (stackPCs[id], id 0 is no
	// stack), the stack of each live block (as PyTorch keeps a block's
	// context_when_allocated) and of each segment, and the scratch space
	// of the stack lookup.
	stackIDs map[string]int32
	stackPCs [][]uintptr
	live     map[device.Ptr]int32
	segs     map[device.Ptr]int32
	key      []byte
}

type historyEntry struct {
	action string
	addr   uint64
	size   uint64
	stream uint64
	timeUs int64
	phase  string
	stack  int32
}

// HistoryOptions configures a History.
type HistoryOptions struct {
	// MaxEntries is the number of entries kept, the latest ones (all of
	// them when 0 or less), as _record_memory_history's max_entries.
	MaxEntries int
	// Stacks records the Go call stack of each entry, and of each live
	// block and segment, as _record_memory_history(stacks="all") records
	// tracebacks: the snapshot gives them as the frames that the
	// visualizer shows for an allocation, without the frames of this
	// library (allocator, observer) that lead to the caller's code. The
	// capture (runtime.Callers in the allocating goroutine) costs about a
	// microsecond per entry; each distinct stack is kept once.
	Stacks bool
}

// maxStackDepth bounds the frames captured per entry.
const maxStackDepth = 64

// NewHistory returns a History that keeps the last maxEntries entries (all
// of them when maxEntries is 0 or less), without call stacks.
func NewHistory(maxEntries int) *History {
	return NewHistoryWith(HistoryOptions{MaxEntries: maxEntries})
}

// NewHistoryWith returns a History configured by opt.
func NewHistoryWith(opt HistoryOptions) *History {
	h := &History{max: max(opt.MaxEntries, 0), stacks: opt.Stacks}
	if opt.Stacks {
		h.stackIDs = make(map[string]int32)
		h.stackPCs = [][]uintptr{nil}
		h.live = make(map[device.Ptr]int32)
		h.segs = make(map[device.Ptr]int32)
	}
	return h
}

// Observe implements allocator.Observer.
func (h *History) Observe(e allocator.Action) {
	var action string
	size := e.Size
	block := false // an entry of a block, whose phase is the block's
	switch e.Kind {
	case allocator.ActionAlloc:
		action, size, block = "alloc", e.Requested, true
	case allocator.ActionFreeRequested:
		action, size, block = "free_requested", e.Requested, true
	case allocator.ActionFreeCompleted:
		action, size, block = "free_completed", e.Requested, true
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
	case allocator.ActionPhase, allocator.ActionStep:
		h.mu.Lock()
		h.phase = e.Phase
		h.mu.Unlock()
		return
	default:
		return // no PyTorch counterpart
	}
	var pcs [maxStackDepth]uintptr
	n := 0
	if h.stacks {
		// Observe runs in the goroutine that called the allocator: skip
		// runtime.Callers and Observe; callsite drops the allocator's
		// frames when the snapshot is written.
		n = runtime.Callers(2, pcs[:])
	}
	en := historyEntry{action: action, addr: uint64(e.Ptr), size: size, stream: uint64(e.Stream), timeUs: nowUs()}

	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case block:
		en.phase = e.Phase
		if e.Kind == allocator.ActionAlloc {
			h.phase = e.Phase // a block gets the phase current when it is handed out
		}
	case e.Kind == allocator.ActionOutOfMemory:
		h.phase = e.Phase
		en.phase = e.Phase
	default:
		en.phase = h.phase
	}
	if h.stacks {
		en.stack = h.internLocked(pcs[:n])
		switch e.Kind {
		case allocator.ActionAlloc:
			h.live[e.Ptr] = en.stack
		case allocator.ActionFreeCompleted:
			delete(h.live, e.Ptr)
		case allocator.ActionSegmentAlloc, allocator.ActionSegmentMap:
			h.segs[e.Ptr] = en.stack
		case allocator.ActionSegmentFree, allocator.ActionSegmentUnmap:
			delete(h.segs, e.Ptr)
		}
	}
	h.addLocked(en)
}

func nowUs() int64 { return time.Now().UnixMicro() }

// addLocked puts en in the ring buffer.
func (h *History) addLocked(en historyEntry) {
	if h.max > 0 && len(h.entries) == h.max {
		h.entries[h.next] = en
		h.next = (h.next + 1) % h.max
		return
	}
	h.entries = append(h.entries, en)
}

// internLocked returns the ID of the stack pcs, giving it one the first
// time it is seen.
func (h *History) internLocked(pcs []uintptr) int32 {
	if len(pcs) == 0 {
		return 0
	}
	h.key = h.key[:0]
	for _, pc := range pcs {
		h.key = binary.LittleEndian.AppendUint64(h.key, uint64(pc))
	}
	if id, ok := h.stackIDs[string(h.key)]; ok {
		return id
	}
	id := int32(len(h.stackPCs))
	h.stackIDs[string(h.key)] = id
	h.stackPCs = append(h.stackPCs, append([]uintptr(nil), pcs...))
	return id
}

// Entries returns the number of entries kept.
func (h *History) Entries() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.entries)
}
