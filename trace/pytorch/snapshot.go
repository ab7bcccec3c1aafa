// This file holds ReadSnapshot, the importer of PyTorch memory snapshots
// (the pickles written by torch.cuda.memory._dump_snapshot).

package pytorch

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strings"
	"unsafe"

	"github.com/nlpodyssey/gopickle/types"

	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/internal/window"
)

// SnapshotOptions tune ReadSnapshot.
type SnapshotOptions struct {
	// Device selects device_traces[Device] and the segments of that device.
	Device int
	// MaxSize is the largest pickle to read, in bytes after
	// decompression; 0 means DefaultMaxPickleSize (1 GiB).
	MaxSize int64
	// MaxMemory bounds the memory of the values decoded from the pickle
	// and of what the import builds from them, together, in bytes; 0
	// means DefaultMaxPickleMemory (1 GiB).
	MaxMemory int64
}

func (opt SnapshotOptions) limits() pickleLimits {
	lim := pickleLimits{size: opt.MaxSize, memory: opt.MaxMemory}
	if lim.size <= 0 {
		lim.size = DefaultMaxPickleSize
	}
	if lim.memory <= 0 {
		lim.memory = DefaultMaxPickleMemory
	}
	return lim
}

// ReadSnapshot converts a PyTorch memory snapshot (the pickle that
// torch.cuda.memory._dump_snapshot writes, plain or gzip) to memtrace ops.
// The pickle may hold only plain data (dicts, lists, tuples, strings,
// numbers); anything that would build a Python object is refused, and no
// code is ever run. It is read as a stream, up to its STOP opcode, within
// the limits of opt and of the package doc (Limits).
//
// From device_traces[opt.Device] it takes alloc entries as a (the size is
// the requested size, as PyTorch records it) and free_completed entries as
// f: the moment the block really returns to the cache. Each cudaStream_t
// becomes a small stream number: the null stream 0 stays 0, the others get
// 1, 2, 3, ... in order of first appearance in the output.
//
// The trace is a window of the run (a ring buffer of the most recent
// entries), so two kinds of block were allocated before it began:
//
//   - a block freed in the window whose address the window has not seen
//     before: its size and stream are the free entry's;
//   - a block active at the end (state active_allocated or
//     active_pending_free in the snapshot's segments) that the window never
//     allocated: its size is the block's requested_size and its stream the
//     segment's.
//
// Both kinds are allocated up front, before the window, in increasing
// address order, and numbered 0, 1, 2, ... in that order; the window's
// allocations take the next IDs in order. Blocks still alive at the end of
// the window, pre-window blocks included, are freed after it in increasing
// ID order, so the trace ends with nothing live.
//
// A free_requested entry with no free_completed before the window ends
// means the block was freed by the program but was still waiting for
// stream work (PyTorch shows it as active_pending_free): it still held its
// memory when the snapshot was taken, so it stays live to the end of the
// window and is freed with the other survivors. free_requested entries are
// otherwise ignored.
//
// segment_alloc, segment_free, segment_map, segment_unmap, snapshot, oom,
// annotate and any action this importer does not know produce no op; they
// are counted in trace.Import.Ignored and named in the notes, and an
// unknown action is named again in a note that begins "warning:". An oom
// entry means an allocation failed in the original run and so was never
// recorded. Keys the import does not use are ignored, whatever they are.
//
// A snapshot without a trace of the device (memory history was not
// recorded: device_traces is missing, too short, or holds an empty list,
// or the pickle is torch.cuda.memory_snapshot()'s list of segments) is the
// state at the snapshot: the active blocks of the device's segments are
// allocated up front and freed after, and the first note says so. With
// neither a trace nor a segment of the device, ReadSnapshot fails.
//
// A snapshot that contradicts itself is an error: an alloc at an address
// the window holds live, a free of an address the window has seen but that
// is not live, a block the window leaves alive that the segments do not
// show as active (or show with another size), or an active block at an
// address the window allocated and freed.
func ReadSnapshot(r io.Reader, opt SnapshotOptions) (*trace.Import, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var in io.Reader = br
	if head, _ := br.Peek(2); trace.IsGzip(head) {
		zr, err := trace.NewGzipReader(br)
		if err != nil {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
		defer zr.Close()
		in = zr
	}
	lim := opt.limits()
	root, spent, err := decodePickleSpent(in, lim)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	return importSnapshot(root, opt, importBudget{left: lim.memory - spent, limit: lim.memory})
}

// The import's costs, in bytes, counted against what the decoded values
// left of SnapshotOptions.MaxMemory before anything is built: the memo
// lets a pickle name one dict millions of times in a few bytes each, so
// the entries the import expands are counted, not the values decoded.
//
// An entry of device_traces may become a decoded event, an op in the
// window, the free of a survivor after it, and an entry in each of the
// three maps by address (live, seen, ids); an active block of the
// segments a pre-window block, its alloc and free ops, and two map
// entries (active, ids).
var (
	costImportEntry = int64(unsafe.Sizeof(snapEvent{})) + 2*int64(unsafe.Sizeof(trace.Op{})) + 3*costSparse
	costImportBlock = int64(unsafe.Sizeof(window.Block{})) + 2*int64(unsafe.Sizeof(trace.Op{})) + 2*costSparse
)

// importBudget is what is left of the memory limit for the import.
type importBudget struct {
	left, limit int64
}

// spend counts n items of cost bytes each, what names them, and fails
// when the budget cannot hold them.
func (b *importBudget) spend(n int, cost int64, what string) error {
	if n > 0 && (cost > 0 && int64(n) > b.left/cost) {
		return fmt.Errorf("snapshot: importing the %d %s needs more than the %d bytes left of the memory limit (%d bytes) "+
			"after decoding (a snapshot recorded with fewer entries is smaller)", n, what, max(b.left, 0), b.limit)
	}
	b.left -= int64(n) * cost
	return nil
}

// knownActions are the actions of current PyTorch's device traces
// (TraceEntry::Action in c10/cuda/CUDACachingAllocator.h) that make no op;
// annotate is written by older versions.
var knownActions = map[string]bool{
	"segment_alloc": true, "segment_free": true, "segment_map": true, "segment_unmap": true,
	"snapshot": true, "oom": true, "annotate": true,
}

// deviceSegments counts the segments of device dev in the snapshot; a
// segment without a device key counts for every device, as the import
// takes it.
func deviceSegments(top *types.Dict, dev int) (int, error) {
	segv, ok := dictGet(top, "segments")
	if !ok {
		return 0, nil
	}
	segs, ok := asList(segv)
	if !ok {
		return 0, fmt.Errorf("snapshot: segments is a %s, not a list", pyTypeName(segv))
	}
	n := 0
	for _, sv := range segs {
		s, ok := sv.(*types.Dict)
		if !ok {
			n++ // the import names the bad segment
			continue
		}
		if dv, ok := dictGet(s, "device"); ok {
			if d, ok := asInt(dv); !ok || d != int64(dev) {
				continue
			}
		}
		n++
	}
	return n, nil
}

// snapEvent is one device_traces entry that matters.
type snapEvent struct {
	action string
	addr   uint64
	size   uint64
	stream uint64
}

func importSnapshot(root any, opt SnapshotOptions, budget importBudget) (*trace.Import, error) {
	var top *types.Dict
	switch v := root.(type) {
	case *types.Dict:
		top = v
	case *types.List:
		// torch.cuda.memory_snapshot() is the segments alone.
		for i, s := range *v {
			if _, ok := s.(*types.Dict); !ok {
				return nil, fmt.Errorf("snapshot: the pickle holds a list whose item %d is a %s: "+
					"neither a snapshot dict nor a list of segments (torch.cuda.memory_snapshot())", i, pyTypeName(s))
			}
		}
		top = &types.Dict{{Key: "segments", Value: v}}
	default:
		return nil, fmt.Errorf("snapshot: the pickle holds a %s, not a snapshot dict", pyTypeName(root))
	}
	if opt.Device < 0 {
		return nil, fmt.Errorf("snapshot: device %d: not a device number", opt.Device)
	}

	// The device's trace: none when memory history was not recorded
	// (no device_traces, or none for this device).
	var entries []any
	haveTrace := false
	missing := "no device_traces"
	if dtv, ok := dictGet(top, "device_traces"); ok {
		dts, ok := asList(dtv)
		if !ok {
			return nil, fmt.Errorf("snapshot: device_traces is a %s, not a list", pyTypeName(dtv))
		}
		if opt.Device < len(dts) {
			if entries, ok = asList(dts[opt.Device]); !ok {
				return nil, fmt.Errorf("snapshot: device_traces[%d] is a %s, not a list", opt.Device, pyTypeName(dts[opt.Device]))
			}
			haveTrace = true
		} else {
			missing = fmt.Sprintf("device_traces for %d devices", len(dts))
		}
	}
	if !haveTrace {
		n, err := deviceSegments(top, opt.Device)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, fmt.Errorf("snapshot: device %d: the snapshot has %s and no segments of that device: nothing to import "+
				"(record memory history with torch.cuda.memory._record_memory_history before the snapshot)", opt.Device, missing)
		}
	}
	where := func(i int) string { return fmt.Sprintf("snapshot: device_traces[%d][%d]", opt.Device, i) }
	if err := budget.spend(len(entries), costImportEntry, fmt.Sprintf("entries of device_traces[%d]", opt.Device)); err != nil {
		return nil, err
	}

	im := &trace.Import{Events: len(entries), Ignored: map[string]int{}}

	// Pass 1: decode the entries, follow which addresses are live, and find
	// the blocks freed in the window that it never allocated.
	events := make([]snapEvent, 0, len(entries))
	type winBlock struct {
		size    uint64
		entry   int
		pending bool // free_requested seen, free_completed not yet
	}
	live := map[uint64]*winBlock{}
	seen := map[uint64]int{} // address -> last entry that allocated or freed it
	var pre []window.Block
	ooms := 0
	unknown := map[string]int{}
	for i, ev := range entries {
		e, ok := ev.(*types.Dict)
		if !ok {
			return nil, fmt.Errorf("%s: entry is a %s, not a dict", where(i), pyTypeName(ev))
		}
		action, err := dictString(e, "action")
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where(i), err)
		}
		switch action {
		case "alloc", "free_completed", "free_requested":
		default:
			im.Ignored[window.Name(action)]++
			if action == "oom" {
				ooms++
			}
			if !knownActions[action] {
				unknown[window.Name(action)]++
			}
			continue
		}
		var se snapEvent
		se.action = action
		if se.addr, err = dictUint(e, "addr"); err == nil {
			if se.size, err = dictUint(e, "size"); err == nil {
				se.stream, err = dictUint(e, "stream")
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %s entry: %w", where(i), action, err)
		}
		switch action {
		case "alloc":
			if b, ok := live[se.addr]; ok {
				return nil, fmt.Errorf("%s: alloc at 0x%x, which is live (allocated by entry %d)", where(i), se.addr, b.entry)
			}
			live[se.addr] = &winBlock{size: se.size, entry: i}
			seen[se.addr] = i
		case "free_completed":
			if b, ok := live[se.addr]; ok {
				if b.size != se.size {
					return nil, fmt.Errorf("%s: free_completed of 0x%x with size %d; entry %d allocated it with size %d",
						where(i), se.addr, se.size, b.entry, b.size)
				}
				delete(live, se.addr)
			} else if last, ok := seen[se.addr]; ok {
				return nil, fmt.Errorf("%s: free_completed of 0x%x, which is not live (entry %d freed it)", where(i), se.addr, last)
			} else {
				pre = append(pre, window.Block{Addr: se.addr, Size: se.size, Stream: se.stream})
			}
			seen[se.addr] = i
		case "free_requested":
			im.Ignored[action]++
			if b, ok := live[se.addr]; ok {
				b.pending = true
			}
			continue
		}
		events = append(events, se)
	}
	im.PreWindowFreed = len(pre)

	// The final segments: active blocks the window never allocated were
	// alive before it; blocks the window leaves alive must be active there.
	var stats struct {
		segments, expandable, active int
		reserved, requested          uint64
	}
	segv, haveSegments := dictGet(top, "segments")
	if haveSegments {
		segs, ok := asList(segv)
		if !ok {
			return nil, fmt.Errorf("snapshot: segments is a %s, not a list", pyTypeName(segv))
		}
		active := map[uint64]bool{}
		for si, sv := range segs {
			swhere := fmt.Sprintf("snapshot: segments[%d]", si)
			s, ok := sv.(*types.Dict)
			if !ok {
				return nil, fmt.Errorf("%s: a %s, not a dict", swhere, pyTypeName(sv))
			}
			if dv, ok := dictGet(s, "device"); ok {
				if d, ok := asInt(dv); !ok || d != int64(opt.Device) {
					continue
				}
			}
			stats.segments++
			if ts, err := dictUint(s, "total_size"); err == nil {
				stats.reserved += ts
			}
			if v, ok := dictGet(s, "is_expandable"); ok && v == true {
				stats.expandable++
			}
			stream, err := dictUint(s, "stream")
			if err != nil {
				return nil, fmt.Errorf("%s: %w", swhere, err)
			}
			bv, ok := dictGet(s, "blocks")
			if !ok {
				continue
			}
			blocks, ok := asList(bv)
			if !ok {
				return nil, fmt.Errorf("%s: blocks is a %s, not a list", swhere, pyTypeName(bv))
			}
			if err := budget.spend(len(blocks), costImportBlock, "blocks of "+strings.TrimPrefix(swhere, "snapshot: ")); err != nil {
				return nil, err
			}
			for bi, bv := range blocks {
				bwhere := fmt.Sprintf("%s.blocks[%d]", swhere, bi)
				b, ok := bv.(*types.Dict)
				if !ok {
					return nil, fmt.Errorf("%s: a %s, not a dict", bwhere, pyTypeName(bv))
				}
				state, err := dictString(b, "state")
				if err != nil {
					return nil, fmt.Errorf("%s: %w", bwhere, err)
				}
				if !strings.HasPrefix(state, "active") {
					continue
				}
				addr, err := dictUint(b, "address")
				if err != nil {
					return nil, fmt.Errorf("%s: %w", bwhere, err)
				}
				size, err := dictUint(b, "requested_size")
				if err != nil {
					return nil, fmt.Errorf("%s: %w", bwhere, err)
				}
				active[addr] = true
				stats.active++
				stats.requested += size
				if wb, ok := live[addr]; ok {
					if wb.size != size {
						return nil, fmt.Errorf("%s: active block at 0x%x has requested_size %d; entry %d allocated it with size %d",
							bwhere, addr, size, wb.entry, wb.size)
					}
					continue
				}
				if last, ok := seen[addr]; ok {
					return nil, fmt.Errorf("%s: active block at 0x%x, but the trace freed that address last (entry %d)", bwhere, addr, last)
				}
				pre = append(pre, window.Block{Addr: addr, Size: size, Stream: stream})
				im.PreWindowLive++
			}
		}
		for addr, wb := range live {
			if !active[addr] {
				return nil, fmt.Errorf("snapshot: entry %d allocated 0x%x and the trace never frees it, but the segments do not show it active",
					wb.entry, addr)
			}
		}
	}

	// Pass 2: number the blocks and emit the ops.
	sort.Slice(pre, func(i, j int) bool { return pre[i].Addr < pre[j].Addr })
	for i := 1; i < len(pre); i++ {
		if pre[i].Addr == pre[i-1].Addr {
			return nil, fmt.Errorf("snapshot: two blocks from before the window at 0x%x (one freed in the window, one active at the end)", pre[i].Addr)
		}
	}
	var streams window.Streams
	ids := make(map[uint64]uint64, len(pre)+len(live))
	im.Ops = make([]trace.Op, 0, len(pre)+len(events)+len(live)+len(pre))
	for i, b := range pre {
		ids[b.Addr] = uint64(i)
		im.Ops = append(im.Ops, trace.Op{Kind: trace.Alloc, ID: uint64(i), Size: b.Size, Stream: streams.Get(b.Stream)})
	}
	im.WindowStart = len(im.Ops)
	next := uint64(len(pre))
	for _, e := range events {
		switch e.action {
		case "alloc":
			ids[e.addr] = next
			im.Ops = append(im.Ops, trace.Op{Kind: trace.Alloc, ID: next, Size: e.size, Stream: streams.Get(e.stream)})
			next++
		case "free_completed":
			im.Ops = append(im.Ops, trace.Op{Kind: trace.Free, ID: ids[e.addr]})
			delete(ids, e.addr)
		}
	}
	im.WindowEnd = len(im.Ops)
	im.Ops = window.FreeSurvivors(im.Ops, ids)

	// Notes for the header.
	pending := 0
	for _, b := range live {
		if b.pending {
			pending++
		}
	}
	if haveTrace && len(entries) == 0 {
		missing = fmt.Sprintf("an empty device_traces[%d]", opt.Device)
	}
	var note string
	if len(entries) > 0 {
		note = fmt.Sprintf("capture: PyTorch memory snapshot, device_traces[%d] (%d entries); alloc->a, free_completed->f; "+
			"%d blocks from before the window allocated up front (%d seen freed in it, %d still active at the snapshot); "+
			"%d blocks alive at the end freed after the window",
			opt.Device, len(entries), len(pre), im.PreWindowFreed, im.PreWindowLive, len(im.Ops)-im.WindowEnd)
		if !haveSegments {
			note += "; the snapshot has no segments, so blocks alive before the window and never freed in it are missing"
		}
	} else {
		note = fmt.Sprintf("capture: PyTorch memory snapshot of device %d without a trace (%s: memory history was not recorded); "+
			"the ops are the %d blocks active at the snapshot, allocated and then freed: a replay shows the state at the snapshot, "+
			"not the run that led to it", opt.Device, missing, len(pre))
	}
	if stats.segments > 0 {
		note += fmt.Sprintf("; the snapshot's segments of device %d: %d (%d expandable), %d bytes reserved, "+
			"%d active blocks of %d bytes requested", opt.Device, stats.segments, stats.expandable, stats.reserved, stats.active, stats.requested)
	}
	im.Notes = append(im.Notes, note)
	if len(im.Ignored) > 0 {
		im.Notes = append(im.Notes, "entries without an op: "+window.CountList(im.Ignored))
	}
	if len(unknown) > 0 {
		im.Notes = append(im.Notes, "warning: actions this importer does not know, skipped: "+window.CountList(unknown))
	}
	if pending > 0 {
		im.Notes = append(im.Notes, fmt.Sprintf("%d blocks had free_requested without free_completed: they stay live to the end of the window", pending))
	}
	if ooms > 0 {
		im.Notes = append(im.Notes, fmt.Sprintf("%d out-of-memory events in the window (the failed allocations are not in the trace)", ooms))
	}
	if s := streams.String(); s != "" {
		im.Notes = append(im.Notes, "streams (cudaStream_t -> trace stream): "+s)
	}
	if sv, ok := dictGet(top, "allocator_settings"); ok {
		var b strings.Builder
		pyRepr(&b, sv, 0)
		im.Notes = append(im.Notes, "allocator_settings="+b.String())
	}
	return im, nil
}
