// Package gpumemtest helps the test suites of programs that use gpumem:
// it fails a test that leaves device memory allocated, checks a memory
// budget (peak reserved bytes, fragmentation), and builds an allocator, on
// a simulated device or on one the test built, that checks itself when the
// test ends.
//
//	func TestTrainStep(t *testing.T) {
//		a := gpumemtest.New(t, gpumemtest.WithCapacity(16<<30),
//			gpumemtest.WithBudget(gpumemtest.Budget{MaxReserved: 6 << 30, MaxFragmentation: 1.3}))
//		runStep(a) // the code under test
//		// When the test ends: invariants hold, nothing is left
//		// allocated, the budget is kept; or the test fails, saying why.
//	}
//
// or, with the same checks when the test ends, on a device the test
// built (here, a simulated device seen through a fault injector, whose
// rules the test adds to j):
//
//	j := faulty.New(dev)
//	a := gpumemtest.NewOn(t, j.Device())
//
// or, with an allocator of the test's own:
//
//	defer gpumemtest.VerifyNoLeaks(t, a)
//
// # Model
//
// A leak, here, is a block still allocated when the test ends: a block
// handed out by Alloc and not given to Free (allocated_bytes.all.current
// above zero), in the spirit of go.uber.org/goleak for goroutines. Memory
// the allocator caches is not a leak, nor is a freed block that waits for
// the work of other streams (pending free). VerifyNoLeaks lists the
// blocks, largest first, from the allocator's Snapshot, and the bytes of
// each phase still allocated when the program names phases. IgnoreCurrent
// excludes the blocks allocated when the verification is set up, for a
// test that shares an allocator holding long-lived state.
//
// (The allocator's own Leaks method answers another question: which
// groups of allocations grow at every step of a running program.)
//
// A Budget bounds two figures of the allocator's stats since its last
// peak reset: the peak of reserved bytes (reserved_bytes.all.peak, what
// the program needs from the device) and the fragmentation, peak
// reserved bytes over peak requested bytes (requested_bytes.all.peak):
// 1.0 would mean the device memory the allocator obtained was never more
// than what callers asked for at their peak; rounding, split segments and
// caching push it above. A failure gives every figure.
//
// The helpers take a TB, the part of testing.TB they use, so that a
// *testing.T, *testing.B or *testing.F can be passed, and so can a fake
// in a test of a helper built on them. They report through t.Errorf (the
// fixture's construction errors through t.Fatalf) and never panic.
package gpumemtest

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/sim"
	"github.com/gpumem/gpumem/internal/simtest"
	"github.com/gpumem/gpumem/stats"
)

// TB is the part of testing.TB the helpers use; *testing.T, *testing.B
// and *testing.F implement it.
type TB interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// maxListed is the number of blocks a LeakError's message lists.
const maxListed = 20

// Block is a block still allocated.
type Block struct {
	Ptr       device.Ptr
	Size      uint64 // bytes of the block
	Requested uint64 // bytes the caller asked for
	Stream    device.Stream
	Pool      stats.Pool
}

// LeakError describes the memory still allocated on a device.
type LeakError struct {
	Device int
	Bytes  uint64  // bytes of the blocks listed
	Blocks []Block // largest first, then by address
	// Phases holds the bytes each phase still has allocated, largest
	// first, when the program named phases (allocator.SetPhase) and no
	// block was ignored (it counts every allocated block).
	Phases []allocator.PhaseBytes
}

// Error lists the blocks, up to maxListed of them.
func (e *LeakError) Error() string {
	var b strings.Builder
	noun := "blocks"
	if len(e.Blocks) == 1 {
		noun = "block"
	}
	fmt.Fprintf(&b, "gpumemtest: device %d: %d %s (%s) still allocated:", e.Device, len(e.Blocks), noun, stats.FormatSize(e.Bytes))
	for i, blk := range e.Blocks {
		if i == maxListed {
			var rest uint64
			for _, r := range e.Blocks[i:] {
				rest += r.Size
			}
			fmt.Fprintf(&b, "\n\t... and %d more (%s)", len(e.Blocks)-i, stats.FormatSize(rest))
			break
		}
		fmt.Fprintf(&b, "\n\t%v %s (requested %d bytes) %s, stream %d", blk.Ptr, stats.FormatSize(blk.Size), blk.Requested, blk.Pool, blk.Stream)
	}
	if len(e.Phases) > 0 {
		b.WriteString("\n\tallocated by phase:")
		for i, p := range e.Phases {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, " %q %s", p.Phase, stats.FormatSize(p.Bytes))
		}
	}
	return b.String()
}

// LeakOption adjusts what FindLeaks and VerifyNoLeaks count as a leak.
type LeakOption func(*leakOptions)

type leakOptions struct {
	ignore map[device.Ptr]uint64 // blocks to ignore: address and size
}

// IgnoreCurrent ignores the blocks a has allocated now: state made before
// the code under test ran. Evaluated when called, so that
//
//	defer gpumemtest.VerifyNoLeaks(t, a, gpumemtest.IgnoreCurrent(a))
//
// reports only what the rest of the test leaves allocated. A block freed
// later and replaced by one of the same address and size is ignored too.
func IgnoreCurrent(a *allocator.Allocator) LeakOption {
	ignore := map[device.Ptr]uint64{}
	if a != nil {
		for _, s := range a.Snapshot() {
			for _, b := range s.Blocks {
				if b.State == allocator.BlockAllocated {
					ignore[b.Ptr] = b.Size
				}
			}
		}
	}
	return func(o *leakOptions) {
		if o.ignore == nil {
			o.ignore = map[device.Ptr]uint64{}
		}
		for p, n := range ignore {
			o.ignore[p] = n
		}
	}
}

// FindLeaks returns a *LeakError listing the blocks a still has
// allocated, or nil when there are none.
func FindLeaks(a *allocator.Allocator, opts ...LeakOption) error {
	if a == nil {
		return errors.New("gpumemtest: FindLeaks: nil allocator")
	}
	var o leakOptions
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	e := &LeakError{Device: a.Device().Ordinal()}
	ignored := false
	for _, s := range a.Snapshot() {
		for _, b := range s.Blocks {
			if b.State != allocator.BlockAllocated {
				continue
			}
			if n, ok := o.ignore[b.Ptr]; ok && n == b.Size {
				ignored = true
				continue
			}
			e.Blocks = append(e.Blocks, Block{Ptr: b.Ptr, Size: b.Size, Requested: b.Requested, Stream: s.Stream, Pool: s.Pool})
			e.Bytes += b.Size
		}
	}
	if len(e.Blocks) == 0 {
		if !ignored {
			if st := a.Stats(); st.Allocated() != 0 {
				// The stats and the blocks disagree: an allocator bug, but
				// still memory the test should hear about.
				return fmt.Errorf("gpumemtest: device %d: allocated_bytes.all.current is %d but no block is allocated", e.Device, st.Allocated())
			}
		}
		return nil
	}
	slices.SortFunc(e.Blocks, func(x, y Block) int {
		if c := cmp.Compare(y.Size, x.Size); c != 0 {
			return c
		}
		return cmp.Compare(x.Ptr, y.Ptr)
	})
	if !ignored {
		named := false
		for _, ph := range a.PhaseStats() {
			if ph.AllocatedBytes.Current > 0 {
				e.Phases = append(e.Phases, allocator.PhaseBytes{Phase: ph.Name, Bytes: uint64(ph.AllocatedBytes.Current)})
				named = named || ph.Name != ""
			}
		}
		if !named {
			e.Phases = nil
		}
		slices.SortStableFunc(e.Phases, func(x, y allocator.PhaseBytes) int { return cmp.Compare(y.Bytes, x.Bytes) })
	}
	return e
}

// VerifyNoLeaks fails the test (t.Errorf) if a still has blocks allocated,
// listing them. Use it at the end of a test, or as
//
//	defer gpumemtest.VerifyNoLeaks(t, a)
func VerifyNoLeaks(t TB, a *allocator.Allocator, opts ...LeakOption) {
	t.Helper()
	if err := FindLeaks(a, opts...); err != nil {
		t.Errorf("%v", err)
	}
}

// Budget bounds what a test may use. A zero field sets no bound.
type Budget struct {
	// MaxReserved bounds the peak of reserved bytes
	// (reserved_bytes.all.peak).
	MaxReserved uint64
	// MaxFragmentation bounds peak reserved bytes over peak requested
	// bytes (see Fragmentation); at least 1 when set.
	MaxFragmentation float64
}

// Fragmentation returns the peak of reserved bytes over the peak of
// requested bytes (reserved_bytes.all.peak / requested_bytes.all.peak):
// how much device memory the allocator needed per byte asked for at the
// peak. It is at least 1 (requested bytes never exceed reserved ones); 1
// when nothing was reserved, +Inf when something was reserved but nothing
// requested (after a peak reset, say).
func Fragmentation(st stats.DeviceStats) float64 {
	reserved, requested := st.MaxReserved(), st.RequestedBytes[stats.All].Peak
	switch {
	case reserved <= 0:
		return 1
	case requested <= 0:
		return math.Inf(1)
	}
	return float64(reserved) / float64(requested)
}

// Check returns an error giving every figure if st exceeds the budget,
// or if the budget itself is invalid.
func (b Budget) Check(st stats.DeviceStats) error {
	if msg := b.check(st); msg != "" {
		return errors.New("gpumemtest: " + msg)
	}
	return nil
}

// check returns what Check reports, without the package prefix, or "".
func (b Budget) check(st stats.DeviceStats) string {
	if math.IsNaN(b.MaxFragmentation) || b.MaxFragmentation < 0 {
		return fmt.Sprintf("invalid budget: MaxFragmentation %v", b.MaxFragmentation)
	}
	reserved := uint64(max(st.MaxReserved(), 0))
	frag := Fragmentation(st)
	var over []string
	if b.MaxReserved > 0 && reserved > b.MaxReserved {
		over = append(over, fmt.Sprintf("peak reserved %s (%d bytes) is over the budget of %s (%d bytes)",
			stats.FormatSize(reserved), reserved, stats.FormatSize(b.MaxReserved), b.MaxReserved))
	}
	if b.MaxFragmentation > 0 && frag > b.MaxFragmentation {
		over = append(over, fmt.Sprintf("fragmentation %.3f is over the budget of %.3f", frag, b.MaxFragmentation))
	}
	if len(over) == 0 {
		return ""
	}
	requested := uint64(max(st.RequestedBytes[stats.All].Peak, 0))
	allocated := uint64(max(st.MaxAllocated(), 0))
	return fmt.Sprintf("%s (peak reserved %s, peak allocated %s, peak requested %s; fragmentation = peak reserved / peak requested = %.3f)",
		strings.Join(over, "; "), stats.FormatSize(reserved), stats.FormatSize(allocated), stats.FormatSize(requested), frag)
}

// VerifyBudget fails the test (t.Errorf) if a's peaks exceed the budget,
// giving the figures. Use it at the end of a test, or with defer.
func VerifyBudget(t TB, a *allocator.Allocator, b Budget) {
	t.Helper()
	if a == nil {
		t.Errorf("gpumemtest: VerifyBudget: nil allocator")
		return
	}
	if msg := b.check(a.Stats()); msg != "" {
		t.Errorf("gpumemtest: device %d: %s", a.Device().Ordinal(), msg)
	}
}

// Option configures the allocator New or NewOn builds.
type Option func(*fixture)

type fixture struct {
	dev        sim.Config
	capacity   uint64
	cfg        allocator.Config
	budget     *Budget
	allowLeaks bool
	simOption  bool // WithDevice or WithCapacity given
}

// WithDevice sets the simulated device's configuration (ordinal, page
// size, costs...); WithCapacity, given too, sets its capacity.
func WithDevice(cfg sim.Config) Option {
	return func(f *fixture) { f.dev, f.simOption = cfg, true }
}

// WithCapacity sets the simulated device's memory in bytes (the default
// is sim.DefaultCapacity).
func WithCapacity(bytes uint64) Option {
	return func(f *fixture) { f.capacity, f.simOption = bytes, true }
}

// WithConfig sets the allocator's configuration (the default is the zero
// Config, PyTorch's defaults).
func WithConfig(cfg allocator.Config) Option { return func(f *fixture) { f.cfg = cfg } }

// WithBudget makes the cleanup verify the budget (VerifyBudget).
func WithBudget(b Budget) Option { return func(f *fixture) { f.budget = &b } }

// AllowLeaks makes the cleanup skip the leak check, for a test that
// leaves blocks allocated on purpose.
func AllowLeaks() Option { return func(f *fixture) { f.allowLeaks = true } }

// New returns an allocator on a new simulated device (a.Device() is a
// *sim.Device, for fault injection and streams) and registers a cleanup
// that, when the test ends, checks the allocator's invariants
// (CheckInvariants), that nothing is left allocated (VerifyNoLeaks, unless
// AllowLeaks) and the budget (WithBudget). A device or configuration that
// cannot be built fails the test with t.Fatalf.
func New(t TB, opts ...Option) *allocator.Allocator {
	t.Helper()
	f := apply(opts)
	devOpts := []simtest.Option{simtest.Config(f.dev)}
	if f.capacity > 0 {
		devOpts = append(devOpts, simtest.Capacity(f.capacity))
	}
	dev := simtest.New(t, devOpts...)
	if dev == nil {
		return nil // t's Fatalf returned: a fake TB
	}
	return build(t, dev, f)
}

// NewOn is New on a device the test built: a simulated device seen
// through a fault injector (device/faulty), a call counter
// (device/counting) or fewer capabilities (device.Compose), or another
// backend. The cleanup is New's. WithDevice and WithCapacity describe
// New's device: given here, or a nil dev, they fail the test with
// t.Fatalf.
func NewOn(t TB, dev device.Device, opts ...Option) *allocator.Allocator {
	t.Helper()
	f := apply(opts)
	switch {
	case dev == nil:
		t.Fatalf("gpumemtest: NewOn: nil device")
		return nil
	case f.simOption:
		t.Fatalf("gpumemtest: NewOn: WithDevice and WithCapacity configure New's device, not a device given")
		return nil
	}
	return build(t, dev, f)
}

// apply returns the fixture the options describe.
func apply(opts []Option) fixture {
	var f fixture
	for _, opt := range opts {
		if opt != nil {
			opt(&f)
		}
	}
	return f
}

// build returns an allocator with f's configuration on dev and registers
// the cleanup New and NewOn describe.
func build(t TB, dev device.Device, f fixture) *allocator.Allocator {
	t.Helper()
	a, err := allocator.New(dev, f.cfg)
	if err != nil {
		t.Fatalf("gpumemtest: allocator: %v", err)
		return nil
	}
	t.Cleanup(func() {
		t.Helper()
		if err := a.CheckInvariants(); err != nil {
			t.Errorf("gpumemtest: device %d: allocator invariants: %v", dev.Ordinal(), err)
		}
		if !f.allowLeaks {
			VerifyNoLeaks(t, a)
		}
		if f.budget != nil {
			VerifyBudget(t, a, *f.budget)
		}
	})
	return a
}
