// This file holds the importer of PyTorch memory snapshots (the pickles
// written by torch.cuda.memory._dump_snapshot) and Import, the result that
// every importer returns.

package trace

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"math/big"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/nlpodyssey/gopickle/types"
)

// Import is another tool's log turned into memtrace ops. Its ops form a
// self-consistent trace: every f names a live ID and every block is freed
// by the end. They come in three parts:
//
//   - Ops[:WindowStart]: allocations of the blocks that were alive before
//     the log's window began (see ReadSnapshot and ReadRMMLog);
//   - Ops[WindowStart:WindowEnd]: the window itself, event by event;
//   - Ops[WindowEnd:]: frees of the blocks still alive at the end, in
//     increasing ID order.
//
// Importers hold the whole result in memory (about 48 bytes an op).
type Import struct {
	Ops         []Op
	WindowStart int
	WindowEnd   int

	// Notes say what was converted and how, one comment line each, for the
	// header of the written trace.
	Notes []string

	// Events is the number of log entries read.
	Events int
	// PreWindowFreed counts blocks allocated before the window and freed in
	// it; PreWindowLive, blocks allocated before the window and alive at its
	// end. Their sum is WindowStart.
	PreWindowFreed int
	PreWindowLive  int
	// Ignored counts entries that produced no op, by action name.
	Ignored map[string]int
}

// WriteOps writes the ops to w, with a comment where the window starts and
// where it ends.
func (im *Import) WriteOps(w *Writer) error {
	for i, op := range im.Ops {
		if i == im.WindowStart && i > 0 {
			if err := w.Comment("history window starts"); err != nil {
				return err
			}
		}
		if i == im.WindowEnd {
			msg := fmt.Sprintf("end of history window: %d blocks still alive, freed below", len(im.Ops)-im.WindowEnd)
			if err := w.Comment(msg); err != nil {
				return err
			}
		}
		if err := w.Write(op); err != nil {
			return err
		}
	}
	return nil
}

// SnapshotOptions tune ReadSnapshot.
type SnapshotOptions struct {
	// Device selects device_traces[Device] and the segments of that device.
	Device int
}

// ReadSnapshot converts a PyTorch memory snapshot (the pickle that
// torch.cuda.memory._dump_snapshot writes, plain or gzip) to memtrace ops.
// The pickle may hold only plain data (dicts, lists, tuples, strings,
// numbers); anything that would build a Python object is refused, and no
// code is ever run.
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
// are counted in Import.Ignored and named in the notes. An oom entry means
// an allocation failed in the original run and so was never recorded.
//
// A snapshot that contradicts itself is an error: an alloc at an address
// the window holds live, a free of an address the window has seen but that
// is not live, a block the window leaves alive that the segments do not
// show as active (or show with another size), or an active block at an
// address the window allocated and freed.
func ReadSnapshot(r io.Reader, opt SnapshotOptions) (*Import, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	if len(data) >= 2 && data[0] == gzipMagic[0] && data[1] == gzipMagic[1] {
		zr, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			return nil, fmt.Errorf("snapshot: gzip: %w", err)
		}
		if data, err = io.ReadAll(zr); err != nil {
			return nil, fmt.Errorf("snapshot: gzip: %w", err)
		}
	}
	root, err := loadPickle(data)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	return importSnapshot(root, opt)
}

// snapEvent is one device_traces entry that matters.
type snapEvent struct {
	action string
	addr   uint64
	size   uint64
	stream uint64
}

// preBlock is a block allocated before the window.
type preBlock struct {
	addr, size, stream uint64
}

func importSnapshot(root any, opt SnapshotOptions) (*Import, error) {
	top, ok := root.(*types.Dict)
	if !ok {
		return nil, fmt.Errorf("snapshot: the pickle holds a %s, not a snapshot dict", pyTypeName(root))
	}
	dtv, ok := dictGet(top, "device_traces")
	if !ok {
		return nil, fmt.Errorf("snapshot: no device_traces (was memory history recorded with torch.cuda.memory._record_memory_history?)")
	}
	dts, ok := asList(dtv)
	if !ok {
		return nil, fmt.Errorf("snapshot: device_traces is a %s, not a list", pyTypeName(dtv))
	}
	if opt.Device < 0 || opt.Device >= len(dts) {
		return nil, fmt.Errorf("snapshot: device %d: the snapshot has device_traces for %d devices", opt.Device, len(dts))
	}
	entries, ok := asList(dts[opt.Device])
	if !ok {
		return nil, fmt.Errorf("snapshot: device_traces[%d] is a %s, not a list", opt.Device, pyTypeName(dts[opt.Device]))
	}
	where := func(i int) string { return fmt.Sprintf("snapshot: device_traces[%d][%d]", opt.Device, i) }

	im := &Import{Events: len(entries), Ignored: map[string]int{}}

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
	var pre []preBlock
	ooms := 0
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
			im.Ignored[action]++
			if action == "oom" {
				ooms++
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
				pre = append(pre, preBlock{addr: se.addr, size: se.size, stream: se.stream})
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
				pre = append(pre, preBlock{addr: addr, size: size, stream: stream})
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
	sort.Slice(pre, func(i, j int) bool { return pre[i].addr < pre[j].addr })
	for i := 1; i < len(pre); i++ {
		if pre[i].addr == pre[i-1].addr {
			return nil, fmt.Errorf("snapshot: two blocks from before the window at 0x%x (one freed in the window, one active at the end)", pre[i].addr)
		}
	}
	streams := streamMap{}
	ids := make(map[uint64]uint64, len(pre)+len(live))
	im.Ops = make([]Op, 0, len(pre)+len(events)+len(live)+len(pre))
	for i, b := range pre {
		ids[b.addr] = uint64(i)
		im.Ops = append(im.Ops, Op{Kind: Alloc, ID: uint64(i), Size: b.size, Stream: streams.get(b.stream)})
	}
	im.WindowStart = len(im.Ops)
	next := uint64(len(pre))
	for _, e := range events {
		switch e.action {
		case "alloc":
			ids[e.addr] = next
			im.Ops = append(im.Ops, Op{Kind: Alloc, ID: next, Size: e.size, Stream: streams.get(e.stream)})
			next++
		case "free_completed":
			im.Ops = append(im.Ops, Op{Kind: Free, ID: ids[e.addr]})
			delete(ids, e.addr)
		}
	}
	im.WindowEnd = len(im.Ops)
	im.Ops = appendSurvivorFrees(im.Ops, ids)

	// Notes for the header.
	pending := 0
	for _, b := range live {
		if b.pending {
			pending++
		}
	}
	note := fmt.Sprintf("capture: PyTorch memory snapshot, device_traces[%d] (%d entries); alloc->a, free_completed->f; "+
		"%d blocks from before the window allocated up front (%d seen freed in it, %d still active at the snapshot); "+
		"%d blocks alive at the end freed after the window",
		opt.Device, len(entries), len(pre), im.PreWindowFreed, im.PreWindowLive, len(im.Ops)-im.WindowEnd)
	if !haveSegments {
		note += "; the snapshot has no segments, so blocks alive before the window and never freed in it are missing"
	}
	im.Notes = append(im.Notes, note)
	if len(im.Ignored) > 0 {
		im.Notes = append(im.Notes, "entries without an op: "+countList(im.Ignored))
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

// appendSurvivorFrees appends a Free for each ID left in ids, in increasing
// ID order.
func appendSurvivorFrees(ops []Op, ids map[uint64]uint64) []Op {
	rest := make([]uint64, 0, len(ids))
	for _, id := range ids {
		rest = append(rest, id)
	}
	slices.Sort(rest)
	for _, id := range rest {
		ops = append(ops, Op{Kind: Free, ID: id})
	}
	return ops
}

// streamMap numbers a log's stream handles: 0 stays 0, others get 1, 2, ...
// in order of first use.
type streamMap struct {
	ids   map[uint64]uint64
	order []uint64
}

func (m *streamMap) get(handle uint64) uint64 {
	if handle == 0 {
		return 0
	}
	if id, ok := m.ids[handle]; ok {
		return id
	}
	if m.ids == nil {
		m.ids = map[uint64]uint64{}
	}
	m.order = append(m.order, handle)
	m.ids[handle] = uint64(len(m.order))
	return m.ids[handle]
}

// String lists the non-zero handles and their numbers, or "" if none.
func (m *streamMap) String() string {
	var parts []string
	for i, h := range m.order {
		parts = append(parts, fmt.Sprintf("0x%x->%d", h, i+1))
	}
	return strings.Join(parts, " ")
}

// countList renders counts as "name=N name=N" in name order.
func countList(m map[string]int) string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}

// Helpers over gopickle's plain values.

func dictGet(d *types.Dict, key string) (any, bool) {
	for _, e := range *d {
		if k, ok := e.Key.(string); ok && k == key {
			return e.Value, true
		}
	}
	return nil, false
}

func asList(v any) ([]any, bool) {
	switch x := v.(type) {
	case *types.List:
		return *x, true
	case *types.Tuple:
		return *x, true
	}
	return nil, false
}

func asInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int:
		return int64(x), true
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	case *big.Int:
		if x.IsInt64() {
			return x.Int64(), true
		}
	}
	return 0, false
}

func dictString(d *types.Dict, key string) (string, error) {
	v, ok := dictGet(d, key)
	if !ok {
		return "", fmt.Errorf("no %q", key)
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%q is a %s, not a string", key, pyTypeName(v))
	}
	return s, nil
}

func dictUint(d *types.Dict, key string) (uint64, error) {
	v, ok := dictGet(d, key)
	if !ok {
		return 0, fmt.Errorf("no %q", key)
	}
	switch x := v.(type) {
	case int:
		if x >= 0 {
			return uint64(x), nil
		}
	case *big.Int:
		if x.IsUint64() {
			return x.Uint64(), nil
		}
	default:
		return 0, fmt.Errorf("%q is a %s, not an integer", key, pyTypeName(v))
	}
	return 0, fmt.Errorf("%q is %s, not a non-negative 64-bit integer", key, fmt.Sprint(v))
}

func pyTypeName(v any) string {
	switch v.(type) {
	case nil:
		return "None"
	case bool:
		return "bool"
	case int, *big.Int:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case []byte:
		return "bytes"
	case *types.ByteArray:
		return "bytearray"
	case *types.List:
		return "list"
	case *types.Tuple:
		return "tuple"
	case *types.Dict:
		return "dict"
	case *types.Set:
		return "set"
	case *types.FrozenSet:
		return "frozenset"
	}
	return fmt.Sprintf("%T", v)
}

var reprEscaper = strings.NewReplacer(`\`, `\\`, "'", `\'`, "\n", `\n`, "\r", `\r`, "\t", `\t`)

// maxReprLen bounds pyRepr's output; a snapshot's settings are short.
const maxReprLen = 4096

// pyRepr writes v the way Python's repr would, for the plain values a
// snapshot holds, cut short after maxReprLen bytes.
func pyRepr(b *strings.Builder, v any, depth int) {
	if b.Len() > maxReprLen || depth > maxPickleDepth {
		b.WriteString("...")
		return
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("None")
	case bool:
		if x {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case int:
		b.WriteString(strconv.Itoa(x))
	case *big.Int:
		b.WriteString(x.String())
	case float64:
		s := strconv.FormatFloat(x, 'g', -1, 64)
		if !strings.ContainsAny(s, ".eEn") {
			s += ".0"
		}
		b.WriteString(s)
	case string:
		b.WriteString("'")
		b.WriteString(reprEscaper.Replace(x))
		b.WriteString("'")
	case *types.List:
		b.WriteString("[")
		for i, e := range *x {
			if i > 0 {
				b.WriteString(", ")
			}
			pyRepr(b, e, depth+1)
		}
		b.WriteString("]")
	case *types.Tuple:
		b.WriteString("(")
		for i, e := range *x {
			if i > 0 {
				b.WriteString(", ")
			}
			pyRepr(b, e, depth+1)
		}
		if len(*x) == 1 {
			b.WriteString(",")
		}
		b.WriteString(")")
	case *types.Dict:
		b.WriteString("{")
		for i, e := range *x {
			if i > 0 {
				b.WriteString(", ")
			}
			pyRepr(b, e.Key, depth+1)
			b.WriteString(": ")
			pyRepr(b, e.Value, depth+1)
		}
		b.WriteString("}")
	default:
		b.WriteString("<" + pyTypeName(v) + ">")
	}
}
