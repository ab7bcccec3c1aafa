// Package window holds what the importers of other tools' logs
// (trace/pytorch, trace/rmm) share. Such a log covers a window of a run,
// not all of it: blocks allocated before the window are allocated up front
// in increasing address order, blocks alive at its end are freed after it
// in increasing ID order, and the logs' stream handles become small stream
// numbers.
package window

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gpumem/gpumem/trace"
)

// Block is a block allocated before the window: its address, size and
// stream handle as the log gives them.
type Block struct {
	Addr, Size, Stream uint64
}

// FreeSurvivors appends a Free for each ID left in ids (address -> ID), in
// increasing ID order.
func FreeSurvivors(ops []trace.Op, ids map[uint64]uint64) []trace.Op {
	rest := make([]uint64, 0, len(ids))
	for _, id := range ids {
		rest = append(rest, id)
	}
	slices.Sort(rest)
	for _, id := range rest {
		ops = append(ops, trace.Op{Kind: trace.Free, ID: id})
	}
	return ops
}

// maxListed bounds what String and CountList name, so that a header
// line stays short (and readable back: trace.MaxLineLength) however many
// streams or names a log has.
const maxListed = 32

// Streams numbers a log's stream handles: 0 stays 0, the others get 1, 2,
// 3, ... in order of first use. The zero Streams is ready to use.
type Streams struct {
	ids   map[uint64]uint64
	order []uint64
}

// Get returns the stream number of handle, numbering it if it is new.
func (m *Streams) Get(handle uint64) uint64 {
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

// String lists the non-zero handles and their numbers ("0x7f00->1 ..."),
// the first maxListed of them and then how many more, or "" if none.
func (m *Streams) String() string {
	var parts []string
	for i, h := range m.order[:min(len(m.order), maxListed)] {
		parts = append(parts, fmt.Sprintf("0x%x->%d", h, i+1))
	}
	if n := len(m.order) - maxListed; n > 0 {
		parts = append(parts, fmt.Sprintf("... (%d more)", n))
	}
	return strings.Join(parts, " ")
}

// CountList renders counts as "name=N name=N" in name order, the first
// maxListed names and then how many more. Names from the input should be
// bounded first (see Name).
func CountList(m map[string]int) string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	slices.Sort(names)
	var parts []string
	for _, k := range names[:min(len(names), maxListed)] {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	if n := len(names) - maxListed; n > 0 {
		parts = append(parts, fmt.Sprintf("... (%d more names)", n))
	}
	return strings.Join(parts, " ")
}

// Name returns a name read from a log (an action, say) as a key for
// CountList: itself when it is a short word of letters, digits and
// underscores, as every name the logs define is, else quoted and cut
// short by trace.Quote.
func Name(s string) string {
	if len(s) > 0 && len(s) <= 64 && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") == "" {
		return s
	}
	return trace.Quote(s)
}
