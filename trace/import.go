// This file holds Import, the memtrace form of another tool's log that the
// importers (trace/pytorch, trace/rmm) return.

package trace

import "fmt"

// Import is another tool's log turned into memtrace ops. Its ops form a
// self-consistent trace: every f names a live ID and every block is freed
// by the end. They come in three parts:
//
//   - Ops[:WindowStart]: allocations of the blocks that were alive before
//     the log's window began;
//   - Ops[WindowStart:WindowEnd]: the window itself, event by event;
//   - Ops[WindowEnd:]: frees of the blocks still alive at the end, in
//     increasing ID order.
//
// An Import holds the whole result in memory (about 64 bytes an op),
// because the blocks from before the window are known only at its end.
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
