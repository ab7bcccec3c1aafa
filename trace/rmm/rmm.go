// This file holds the importer of RMM's logging_resource_adaptor CSV logs.

package rmm

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/gpumem/gpumem/trace"
	"github.com/gpumem/gpumem/trace/internal/window"
)

// ReadLog converts the CSV log of RMM's logging_resource_adaptor to
// memtrace ops. The log starts with a header row naming its columns
// (Thread,Time,Action,Pointer,Size,Stream); the importer needs Action,
// Pointer, Size and Stream, in any order, and ignores the others. Rows are
// taken in file order, whatever their thread.
//
// An allocate row becomes a with the row's size; a free row (spelled
// "free" or "deallocate") becomes f of the block at that pointer, and its
// size must match the allocation's. Pointers are hexadecimal, with or
// without 0x; "(nil)" is 0. Streams (the cudaStream_t, in hex with 0x or
// in decimal) become small stream numbers: 0 stays 0, the others get 1, 2,
// 3, ... in order of first appearance in the output. An "allocate failure"
// row produces no op (the allocation failed in the original run), nor do
// zero-byte rows with a null pointer (no memory changed hands); both are
// counted in trace.Import.Ignored.
//
// The log may start after the program did: a free of a pointer that the
// log has not seen before names a block allocated before the log began.
// Such blocks are allocated up front, before the log's ops, in increasing
// address order with the size and stream of their free row, and numbered
// 0, 1, 2, ... in that order; the log's allocations take the next IDs.
// Blocks still alive at the end of the log are freed after it in
// increasing ID order, so the trace ends with nothing live.
//
// A log that contradicts itself is an error naming the CSV line: an
// allocate of a pointer that is live, a free of a pointer the log has seen
// but that is not live, or a free whose size differs from the allocation.
//
// The reader takes the log as RMM writes it, one row a line: a line longer
// than trace.MaxLineLength (64 KiB) is an error, so that memory stays
// bounded by the rows kept, and so is a quoted field that holds a line
// break. A UTF-8 byte order mark before the header is skipped. Error
// messages quote at most trace.MaxQuote bytes of a row.
func ReadLog(r io.Reader) (*trace.Import, error) {
	lines := &lineLimiter{r: r, line: 1}
	cr := csv.NewReader(lines)
	cr.ReuseRecord = true
	header, err := cr.Read()
	if err == io.EOF {
		return nil, errors.New("rmm log: empty input (want a header row Thread,Time,Action,Pointer,Size,Stream)")
	}
	if err != nil {
		return nil, fmt.Errorf("rmm log: %w", err)
	}
	header = slices.Clone(header) // the reader reuses its record
	if len(header) > 0 {
		header[0] = strings.TrimPrefix(header[0], "\ufeff")
	}
	col := map[string]int{}
	for i, h := range header {
		if strings.ContainsAny(h, "\r\n") {
			return nil, fmt.Errorf("rmm log: the header row has a field with a line break in it: %s", trace.Quote(h))
		}
		col[strings.TrimSpace(h)] = i
	}
	need := []string{"Action", "Pointer", "Size", "Stream"}
	idx := make([]int, len(need))
	for i, name := range need {
		c, ok := col[name]
		if !ok {
			return nil, fmt.Errorf("rmm log: the header row has no %s column (want Thread,Time,Action,Pointer,Size,Stream)", name)
		}
		idx[i] = c
	}

	type event struct {
		free         bool
		ptr, size    uint64
		stream       uint64
		preWindowIdx int // for a free of a pre-window block: its index in pre, else -1
	}
	type liveBlock struct {
		size uint64
		line int
	}
	im := &trace.Import{Ignored: map[string]int{}}
	var events []event
	live := map[uint64]liveBlock{}
	seen := map[uint64]int{} // pointer -> last line that allocated or freed it
	var pre []window.Block
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("rmm log: %w", err)
		}
		line, _ := cr.FieldPos(0)
		im.Events++
		where := func(msg string, args ...any) error {
			return fmt.Errorf("rmm log line %d: %s: %s", line, trace.Quote(strings.Join(rec, ",")), fmt.Sprintf(msg, args...))
		}
		for i, f := range rec {
			if strings.ContainsAny(f, "\r\n") {
				name := fmt.Sprintf("field %d", i+1)
				if i < len(header) {
					name = "the " + strings.TrimSpace(header[i]) + " field"
				}
				return nil, where("%s holds a line break (an RMM log has one row a line)", trace.Excerpt(name))
			}
		}
		action := strings.TrimSpace(rec[idx[0]])
		ptr, ok := parseHexPointer(strings.TrimSpace(rec[idx[1]]))
		if !ok {
			return nil, where("pointer is not a hexadecimal address")
		}
		size, err := strconv.ParseUint(strings.TrimSpace(rec[idx[2]]), 10, 64)
		if err != nil {
			return nil, where("size is not a non-negative integer")
		}
		stream, ok := parseStream(strings.TrimSpace(rec[idx[3]]))
		if !ok {
			return nil, where("stream is not an integer handle")
		}
		var free bool
		switch action {
		case "allocate":
		case "free", "deallocate":
			free = true
		case "allocate failure":
			im.Ignored[action]++
			continue
		default:
			return nil, where("unknown action %s (want allocate, free or allocate failure)", trace.Quote(action))
		}
		if ptr == 0 {
			if size != 0 {
				return nil, where("null pointer for %d bytes", size)
			}
			im.Ignored["zero-byte null "+action]++
			continue
		}
		ev := event{free: free, ptr: ptr, size: size, stream: stream, preWindowIdx: -1}
		if !free {
			if b, ok := live[ptr]; ok {
				return nil, where("allocate of 0x%x, which is live (allocated on line %d)", ptr, b.line)
			}
			live[ptr] = liveBlock{size: size, line: line}
		} else if b, ok := live[ptr]; ok {
			if b.size != size {
				return nil, where("free of 0x%x with size %d; line %d allocated it with size %d", ptr, size, b.line, b.size)
			}
			delete(live, ptr)
		} else if last, ok := seen[ptr]; ok {
			return nil, where("free of 0x%x, which is not live (line %d freed it)", ptr, last)
		} else {
			ev.preWindowIdx = len(pre)
			pre = append(pre, window.Block{Addr: ptr, Size: size, Stream: stream})
		}
		seen[ptr] = line
		events = append(events, ev)
	}
	im.PreWindowFreed = len(pre)

	// Number the pre-window blocks in address order, then emit.
	order := make([]int, len(pre))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return pre[order[a]].Addr < pre[order[b]].Addr })
	preID := make([]uint64, len(pre))
	var streams window.Streams
	im.Ops = make([]trace.Op, 0, len(pre)+len(events)+len(live))
	for id, i := range order {
		preID[i] = uint64(id)
		b := pre[i]
		im.Ops = append(im.Ops, trace.Op{Kind: trace.Alloc, ID: uint64(id), Size: b.Size, Stream: streams.Get(b.Stream)})
	}
	im.WindowStart = len(im.Ops)
	next := uint64(len(pre))
	ids := map[uint64]uint64{}
	for _, e := range events {
		switch {
		case !e.free:
			ids[e.ptr] = next
			im.Ops = append(im.Ops, trace.Op{Kind: trace.Alloc, ID: next, Size: e.size, Stream: streams.Get(e.stream)})
			next++
		case e.preWindowIdx >= 0:
			im.Ops = append(im.Ops, trace.Op{Kind: trace.Free, ID: preID[e.preWindowIdx]})
		default:
			im.Ops = append(im.Ops, trace.Op{Kind: trace.Free, ID: ids[e.ptr]})
			delete(ids, e.ptr)
		}
	}
	im.WindowEnd = len(im.Ops)
	im.Ops = window.FreeSurvivors(im.Ops, ids)

	im.Notes = append(im.Notes, fmt.Sprintf("capture: RMM logging_resource_adaptor CSV (%d rows); allocate->a, free->f; "+
		"%d blocks freed in the log but allocated before it, allocated up front; %d blocks alive at the end freed after the log",
		im.Events, len(pre), len(im.Ops)-im.WindowEnd))
	if len(im.Ignored) > 0 {
		im.Notes = append(im.Notes, "rows without an op: "+window.CountList(im.Ignored))
	}
	if s := streams.String(); s != "" {
		im.Notes = append(im.Notes, "streams (cudaStream_t -> trace stream): "+s)
	}
	return im, nil
}

// parseHexPointer parses a %p pointer: hex with or without 0x, or "(nil)".
func parseHexPointer(s string) (uint64, bool) {
	if s == "(nil)" {
		return 0, true
	}
	if strings.HasPrefix(s, "0x") || strings.HasPrefix(s, "0X") {
		s = s[2:]
	}
	if s == "" {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 16, 64)
	return v, err == nil
}

// parseStream parses a stream handle: hex with 0x, decimal without, or
// "(nil)". Only its identity matters.
func parseStream(s string) (uint64, bool) {
	if s == "(nil)" {
		return 0, true
	}
	if strings.HasPrefix(s, "0x") || strings.HasPrefix(s, "0X") {
		if len(s) == 2 {
			return 0, false
		}
		v, err := strconv.ParseUint(s[2:], 16, 64)
		return v, err == nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil
}

// lineLimiter passes r through but fails a line longer than
// trace.MaxLineLength, so that the CSV reader never holds more than that
// of one row.
type lineLimiter struct {
	r    io.Reader
	n    int // bytes of the current line so far
	line int // the current line's number
}

func (l *lineLimiter) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	for i, c := range p[:n] {
		if c == '\n' {
			l.n = 0
			l.line++
			continue
		}
		if l.n++; l.n > trace.MaxLineLength {
			return i, fmt.Errorf("line %d is longer than %d bytes (an RMM log has one short row a line)", l.line, trace.MaxLineLength)
		}
	}
	return n, err
}
