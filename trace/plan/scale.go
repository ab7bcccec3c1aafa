// This file holds Model: probe traces aligned op by op, each allocation's
// size modelled as p + q × batch, and traces synthesized at any batch.

package plan

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/trace"
)

// Probe is a trace of a program run at a known batch size.
type Probe struct {
	Name  string // where it came from, for messages
	Batch uint64 // at least 1
	Ops   []trace.Op
}

// MaxBatch is the largest batch a Model synthesizes: 2^40.
const MaxBatch = 1 << 40

// maxModelSize bounds the sizes, intercepts and slopes a Model holds, so
// that its arithmetic stays within 64 bits: 2^62 bytes, far above any
// request an allocator serves.
const maxModelSize = 1 << 62

// Model is what NewModel learned from probes of one program at several
// batch sizes: the program's ops, and each allocation's size as
// p + q × batch bytes.
type Model struct {
	ops     []trace.Op // the first probe's ops; Size is set per batch
	p, q    []int64    // by op index; 0 for ops other than allocations
	varying int
	lo, hi  uint64 // the batches at which every size is >= 0 and fits
}

// AlignError says where probes do not align or do not fit the model.
type AlignError struct {
	Op     int    // the op's number in the probes, from 1
	Reason string // what is wrong, with each probe's op
}

func (e *AlignError) Error() string { return fmt.Sprintf("op %d: %s", e.Op, e.Reason) }

// NewModel aligns two or more probes of one program op by op and models
// each allocation's size as p + q × batch, with p and q whole numbers of
// bytes.
//
// Alignment: every probe must have the same ops in the same order: op i of
// each is of the same kind, on the same stream, with the same tag or mark
// name, and a free or record-stream of op i names, in every probe, the
// block allocated by the same earlier op (block IDs may differ between
// probes). The model comes from the two probes with the smallest batches;
// every further probe checks it, and must fit it exactly. The first op
// that does not align, or whose sizes do not fit, is reported as an
// *AlignError.
func NewModel(probes ...Probe) (*Model, error) {
	if len(probes) < 2 {
		return nil, errors.New("scale: need at least two probes at different batch sizes")
	}
	order := make([]int, len(probes))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(probes[a].Batch, probes[b].Batch) })
	for k, i := range order {
		b := probes[i].Batch
		if b < 1 || b > MaxBatch {
			return nil, fmt.Errorf("scale: probe %s: batch %d is not between 1 and %d", probes[i].Name, b, uint64(MaxBatch))
		}
		if k > 0 && b == probes[order[k-1]].Batch {
			return nil, fmt.Errorf("scale: probes %s and %s have the same batch %d", probes[order[k-1]].Name, probes[i].Name, b)
		}
	}
	first := probes[0].Ops
	for _, pr := range probes[1:] {
		if len(pr.Ops) != len(first) {
			n := min(len(pr.Ops), len(first))
			if err := align(probes, n); err != nil {
				return nil, err
			}
			return nil, &AlignError{Op: n + 1, Reason: fmt.Sprintf("%s has %d ops, %s has %d", probes[0].Name, len(first), pr.Name, len(pr.Ops))}
		}
	}
	if err := align(probes, len(first)); err != nil {
		return nil, err
	}
	m := &Model{ops: slices.Clone(first), p: make([]int64, len(first)), q: make([]int64, len(first)), lo: 1, hi: MaxBatch}
	a, b := probes[order[0]], probes[order[1]]
	db := int64(b.Batch - a.Batch)
	for i := range first {
		if first[i].Kind != trace.Alloc {
			continue
		}
		for _, pr := range probes {
			if pr.Ops[i].Size > maxModelSize {
				return nil, &AlignError{Op: i + 1, Reason: fmt.Sprintf("size %d in %s is too large to model", pr.Ops[i].Size, pr.Name)}
			}
		}
		sa, sb := int64(a.Ops[i].Size), int64(b.Ops[i].Size)
		if (sb-sa)%db != 0 {
			return nil, &AlignError{Op: i + 1, Reason: fmt.Sprintf("sizes %d at batch %d and %d at batch %d do not fit p + q × batch in whole bytes",
				sa, a.Batch, sb, b.Batch)}
		}
		q := (sb - sa) / db
		qa, ok := mul(q, a.Batch)
		p := sa - qa
		if !ok || p <= -maxModelSize || p >= maxModelSize {
			return nil, &AlignError{Op: i + 1, Reason: fmt.Sprintf("sizes %d at batch %d and %d at batch %d give an intercept too large to model",
				sa, a.Batch, sb, b.Batch)}
		}
		m.p[i], m.q[i] = p, q
		if q != 0 {
			m.varying++
		}
		for _, k := range order[2:] {
			pr := probes[k]
			if got, ok := predict(p, q, pr.Batch); !ok || got != pr.Ops[i].Size {
				return nil, &AlignError{Op: i + 1, Reason: fmt.Sprintf("size %d at batch %d does not fit %s from batches %d and %d (which predicts %s)",
					pr.Ops[i].Size, pr.Batch, formula(p, q), a.Batch, b.Batch, predictText(p, q, pr.Batch))}
			}
		}
		// The batches at which the size is at least 0 and at most
		// maxModelSize.
		switch {
		case q > 0:
			if p < 0 {
				m.lo = max(m.lo, uint64((-p+q-1)/q))
			}
			m.hi = min(m.hi, uint64((maxModelSize-p)/q))
		case q < 0:
			if p < 0 {
				m.hi = 0
			} else {
				m.hi = min(m.hi, uint64(p/-q))
			}
		}
	}
	return m, nil
}

// align checks the first n ops of the probes for alignment.
func align(probes []Probe, n int) error {
	blocks := make([]map[uint64]int, len(probes)) // ID -> number of the op that allocated it
	for k := range blocks {
		blocks[k] = map[uint64]int{}
	}
	for i := 0; i < n; i++ {
		want := probes[0].Ops[i]
		wantBlock := -1
		for k, pr := range probes {
			op := pr.Ops[i]
			block := -1
			switch op.Kind {
			case trace.Alloc:
				blocks[k][op.ID] = i
			case trace.Free, trace.RecordStream:
				b, ok := blocks[k][op.ID]
				if !ok {
					return &AlignError{Op: i + 1, Reason: fmt.Sprintf("%s: %q names a block that is not live", pr.Name, clip(op.String()))}
				}
				block = b
				if op.Kind == trace.Free {
					delete(blocks[k], op.ID)
				}
			}
			if k == 0 {
				wantBlock = block
				continue
			}
			if op.Kind != want.Kind || op.Stream != want.Stream || op.Tag != want.Tag || op.Name != want.Name || block != wantBlock {
				return &AlignError{Op: i + 1, Reason: fmt.Sprintf("%s has %q, %s has %q",
					probes[0].Name, clip(want.String()), pr.Name, clip(op.String()))}
			}
		}
	}
	return nil
}

// clip shortens s to about 100 bytes for a message.
func clip(s string) string {
	if len(s) <= 100 {
		return s
	}
	return s[:100] + "..."
}

// mul returns q × b, and false if its magnitude is above maxModelSize.
func mul(q int64, b uint64) (int64, bool) {
	aq := uint64(q)
	if q < 0 {
		aq = uint64(-q)
	}
	hi, lo := bits.Mul64(aq, b)
	if hi != 0 || lo > maxModelSize {
		return 0, false
	}
	if q < 0 {
		return -int64(lo), true
	}
	return int64(lo), true
}

// predict returns p + q × b, and false if it is negative or above
// maxModelSize. |p| < 2^62, so the sum cannot overflow.
func predict(p, q int64, b uint64) (uint64, bool) {
	v, ok := mul(q, b)
	if !ok {
		return 0, false
	}
	s := p + v
	if s < 0 || s > maxModelSize {
		return 0, false
	}
	return uint64(s), true
}

func predictText(p, q int64, b uint64) string {
	if s, ok := predict(p, q, b); ok {
		return fmt.Sprint(s)
	}
	return "a size out of range"
}

func formula(p, q int64) string {
	return fmt.Sprintf("%d + %d × batch", p, q)
}

// Len returns the number of ops of the modelled trace.
func (m *Model) Len() int { return len(m.ops) }

// Varying returns the number of allocations whose size depends on the
// batch (q != 0).
func (m *Model) Varying() int { return m.varying }

// Range returns the batches the model can synthesize: those at which
// every size is at least 0 and at most 2^62 bytes, capped at MaxBatch.
// lo > hi if there are none.
func (m *Model) Range() (lo, hi uint64) { return m.lo, m.hi }

// Ops returns the trace synthesized at batch b: the probes' ops, with
// each allocation's size p + q × b.
func (m *Model) Ops(b uint64) ([]trace.Op, error) {
	ops := slices.Clone(m.ops)
	if err := m.fill(ops, b); err != nil {
		return nil, err
	}
	return ops, nil
}

// fill sets the sizes of ops (a copy of m.ops) for batch b.
func (m *Model) fill(ops []trace.Op, b uint64) error {
	for i := range ops {
		if ops[i].Kind != trace.Alloc {
			continue
		}
		s, ok := predict(m.p[i], m.q[i], b)
		if !ok {
			return &AlignError{Op: i + 1, Reason: fmt.Sprintf("the size %s is out of range at batch %d", formula(m.p[i], m.q[i]), b)}
		}
		ops[i].Size = s
	}
	return nil
}

// PeakRequested returns the most bytes the synthesized trace at batch b
// holds at once (PeakRequested of Ops(b)), without building it.
func (m *Model) PeakRequested(b uint64) (uint64, error) {
	live := make(map[uint64]uint64)
	var cur, peak uint64
	for i := range m.ops {
		op := &m.ops[i]
		switch op.Kind {
		case trace.Alloc:
			s, ok := predict(m.p[i], m.q[i], b)
			if !ok {
				return 0, &AlignError{Op: i + 1, Reason: fmt.Sprintf("the size %s is out of range at batch %d", formula(m.p[i], m.q[i]), b)}
			}
			live[op.ID] = s
			if cur+s < cur {
				return math.MaxUint64, nil
			}
			cur += s
			peak = max(peak, cur)
		case trace.Free:
			cur -= live[op.ID]
			delete(live, op.ID)
		}
	}
	return peak, nil
}

// Predict replays the trace synthesized at batch b with cfg on a
// simulated device of capacity bytes (DefaultCapacity if 0).
func (m *Model) Predict(b uint64, cfg allocator.Config, capacity uint64) (*Outcome, error) {
	return m.PredictContext(context.Background(), b, cfg, capacity)
}

// PredictContext is Predict, stopped when ctx is done (ReplayContext).
func (m *Model) PredictContext(ctx context.Context, b uint64, cfg allocator.Config, capacity uint64) (*Outcome, error) {
	ops, err := m.Ops(b)
	if err != nil {
		return nil, err
	}
	return ReplayContext(ctx, ops, cfg, capacity)
}

// BatchTrial is one replay that MaxBatch made.
type BatchTrial struct {
	Batch uint64 `json:"batch"`
	OOMs  int64  `json:"ooms"`
}

// MaxBatchResult is the largest batch that fits a device.
type MaxBatchResult struct {
	// MaxBatch is the largest batch whose synthesized trace replays with
	// no out-of-memory error; 0 if none does.
	MaxBatch uint64
	// Unbounded says that MaxBatch is the largest batch the model can
	// synthesize, and it fits: the peak does not grow with the batch, or
	// not enough to matter.
	Unbounded bool
	// Trials lists every replay made, in order.
	Trials []BatchTrial
}

// MaxBatch finds the largest batch whose synthesized trace replays with
// no out-of-memory error with cfg on a simulated device of capacity bytes.
//
// No batch whose peak requested bytes exceed the capacity can fit, which
// bounds the search without a replay; below that bound it bisects over
// replays, assuming that a bigger batch never needs less memory (true
// when no size shrinks as the batch grows), and verifies the answer: it
// fits, and the next batch does not (by replay, or by the bound).
func (m *Model) MaxBatch(cfg allocator.Config, capacity uint64) (*MaxBatchResult, error) {
	return m.MaxBatchContext(context.Background(), cfg, capacity)
}

// MaxBatchContext is MaxBatch, stopped when ctx is done: each replay
// checks ctx every thousand ops or so (ReplayContext).
func (m *Model) MaxBatchContext(ctx context.Context, cfg allocator.Config, capacity uint64) (*MaxBatchResult, error) {
	if capacity == 0 {
		capacity = DefaultCapacity
	}
	res := &MaxBatchResult{}
	lo, hi := m.Range()
	if lo > hi {
		return res, nil
	}
	underCap := func(b uint64) (bool, error) {
		p, err := m.PeakRequested(b)
		return p <= capacity, err
	}
	if ok, err := underCap(lo); err != nil || !ok {
		return res, err
	}
	// The largest batch in [lo, hi] whose peak requested fits: the peak is
	// a maximum of linear functions of the batch, so the batches under the
	// capacity form an interval.
	top := lo
	for step := uint64(1); top < hi; step *= 2 {
		next := min(hi, top+step)
		ok, err := underCap(next)
		if err != nil {
			return nil, err
		}
		if !ok {
			if top, err = lastTrue(top, next, underCap); err != nil {
				return nil, err
			}
			break
		}
		top = next
	}
	ops := slices.Clone(m.ops)
	fits := func(b uint64) (bool, error) {
		if err := m.fill(ops, b); err != nil {
			return false, err
		}
		o, err := ReplayContext(ctx, ops, cfg, capacity)
		if err != nil {
			return false, fmt.Errorf("replay at batch %d: %w", b, err)
		}
		res.Trials = append(res.Trials, BatchTrial{b, o.OOMs})
		return o.OOMs == 0, nil
	}
	ok, err := fits(lo)
	if err != nil || !ok {
		return res, err
	}
	a, b := lo, top+1 // a fits; b does not (by the bound), unless top == hi
	if ok, err := fits(top); err != nil {
		return nil, err
	} else if ok {
		if top == hi {
			res.MaxBatch, res.Unbounded = top, top == MaxBatch
			return res, nil
		}
		a = top
	} else {
		b = top
	}
	if res.MaxBatch, err = lastTrue(a, b, fits); err != nil {
		return nil, err
	}
	return res, nil
}

// lastTrue bisects [a, b) for the last value where pred holds, given that
// it holds at a, not at b, and changes once between them.
func lastTrue(a, b uint64, pred func(uint64) (bool, error)) (uint64, error) {
	for b-a > 1 {
		mid := a + (b-a)/2
		ok, err := pred(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			a = mid
		} else {
			b = mid
		}
	}
	return a, nil
}
