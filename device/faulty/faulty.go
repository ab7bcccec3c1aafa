// Package faulty wraps any device.Device and fails chosen calls, so that
// tests can show that code above a device survives every failure a real
// driver can return, on any backend (the simulated device, the CUDA
// backend on its stub driver, or a real card).
//
// # Model
//
// New(inner) returns an Injector; Injector.Device is the device to use in
// inner's place. The injector numbers the calls of each kind (each
// device.Call: malloc, free, memory info, device and stream
// synchronization, event record / query / synchronize / release, reserve,
// map, unmap, release, host alloc / free, wait event, copies to and from
// the host, and the stream-ordered pool's calls) from 1, in the order they reach
// it. A Rule fails a window of those calls: the Nth call of its kind after
// the rule was added, and the Count-1 calls after it (Count Always: every
// call from the Nth on). Rules combine: a call fails when any rule's window
// holds it, and the rule added first among those is the one recorded.
//
// A failed call never reaches inner, so it changes nothing there; it
// returns a *Fault, which wraps the rule's error (device.ErrOutOfMemory
// for an out-of-memory failure, or any sentinel the test chooses) and
// ErrInjected, so that errors.Is tells an injected failure from a real
// one. Every fault that fires is recorded (Fired), in order.
//
// The infallible reads (Ordinal, Name, Granularity, HasStream,
// BytesInUse) are forwarded and never fail. The wrapped device offers
// exactly the optional capabilities of inner (see "Adaptors" in package
// device): a rule on a capability inner lacks never fires, because no
// caller can make that call.
//
// # Determinism and concurrency
//
// Which call fails depends only on the order in which calls reach the
// injector: the same sequence of calls fails at the same places in every
// run. An Injector is safe for concurrent use; one mutex, held briefly and
// never while inner runs, orders the calls it numbers, so under
// concurrent callers the numbering follows the order they reach it.
package faulty

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/internal/intercept"
)

// ErrInjected is wrapped by every failure an Injector makes, and is the
// whole of a failure whose rule names no error: a generic device error.
var ErrInjected = errors.New("injected device fault")

// Always, as a Rule's Count, fails every call of the rule's kind from its
// Nth on.
const Always = -1

// A Rule says which calls of one kind fail, and with what.
type Rule struct {
	// Call is the kind of call to fail.
	Call device.Call
	// Nth is the first call to fail, counting the calls of that kind that
	// reach the injector after the rule is added: 1 (or 0) is the next
	// one.
	Nth int64
	// Count is how many calls fail from the Nth on, consecutively: 0 or 1
	// is once, Always is every call from the Nth on.
	Count int64
	// Err is what the failure wraps besides ErrInjected:
	// device.ErrOutOfMemory for an out-of-memory error, or any other
	// sentinel. nil gives a generic device error (ErrInjected alone).
	Err error
}

// A Fault is a failure that fired: the error the failed call returned,
// and its record.
type Fault struct {
	Call   device.Call
	Device int   // the ordinal of the wrapped device
	N      int64 // the call's number among the calls of its kind that reached the injector, from 1
	Rule   int   // the id of the rule that fired, as Add returned it
	Err    error // the rule's error, or ErrInjected
}

// Error reads like a backend's error: "device 0: map: out of memory
// (injected fault: rule 0, map call 3)".
func (f *Fault) Error() string {
	if f.Err == ErrInjected {
		return fmt.Sprintf("device %d: %v: %v (rule %d, %v call %d)", f.Device, f.Call, ErrInjected, f.Rule, f.Call, f.N)
	}
	return fmt.Sprintf("device %d: %v: %v (injected fault: rule %d, %v call %d)", f.Device, f.Call, f.Err, f.Rule, f.Call, f.N)
}

// Unwrap returns the rule's error and ErrInjected, for errors.Is.
func (f *Fault) Unwrap() []error {
	if f.Err == ErrInjected {
		return []error{ErrInjected}
	}
	return []error{f.Err, ErrInjected}
}

// rule is an added Rule as a window of call numbers [from, to] of its
// kind; to < 0 is unbounded.
type rule struct {
	Rule
	id       int
	from, to int64
}

// An Injector fails the calls its rules name. The zero Injector is not
// usable; make one with New.
type Injector struct {
	dev     device.Device
	ordinal int

	mu     sync.Mutex // guards everything below
	calls  [device.NumCalls]int64
	rules  []rule
	nextID int
	fired  []Fault
}

// New returns an Injector whose Device forwards to inner, failing nothing
// until a rule is added. If inner is nil, Device returns nil (which
// allocator.New refuses with an error).
func New(inner device.Device) *Injector {
	j := &Injector{}
	if inner != nil {
		j.ordinal = inner.Ordinal()
	}
	j.dev = intercept.New(inner, hooks{j})
	return j
}

// Device returns the wrapped device, with exactly inner's capabilities.
func (j *Injector) Device() device.Device { return j.dev }

// Add adds a rule and returns its id (0, 1, 2, ... in the order rules are
// added). A rule whose Call is not a device.Call, or whose Nth or Count is
// out of range, is refused with an error wrapping
// device.ErrInvalidArgument and nothing is added.
func (j *Injector) Add(r Rule) (int, error) {
	if r.Call >= device.NumCalls {
		return 0, fmt.Errorf("faulty: %v is not a device call: %w", r.Call, device.ErrInvalidArgument)
	}
	if r.Nth < 0 {
		return 0, fmt.Errorf("faulty: rule on %v: Nth %d is negative: %w", r.Call, r.Nth, device.ErrInvalidArgument)
	}
	if r.Count < Always {
		return 0, fmt.Errorf("faulty: rule on %v: Count %d is neither a count nor Always: %w", r.Call, r.Count, device.ErrInvalidArgument)
	}
	nth, count := max(r.Nth, 1), r.Count
	if count == 0 {
		count = 1
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	base := j.calls[r.Call]
	if nth > math.MaxInt64-base {
		return 0, fmt.Errorf("faulty: rule on %v: Nth %d is beyond any call: %w", r.Call, r.Nth, device.ErrInvalidArgument)
	}
	from, to := base+nth, int64(-1)
	if count != Always && count-1 <= math.MaxInt64-from {
		to = from + count - 1
	}
	id := j.nextID
	j.nextID++
	j.rules = append(j.rules, rule{Rule: r, id: id, from: from, to: to})
	return id, nil
}

// Remove removes the rule with the given id and reports whether there was
// one. Faults it fired stay recorded.
func (j *Injector) Remove(id int) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	i := slices.IndexFunc(j.rules, func(r rule) bool { return r.id == id })
	if i < 0 {
		return false
	}
	j.rules = slices.Delete(j.rules, i, i+1)
	return true
}

// Clear removes every rule and forgets the faults fired so far. Call
// numbers and rule ids go on from where they were.
func (j *Injector) Clear() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.rules = nil
	j.fired = nil
}

// Fired returns the faults that fired, in the order they fired.
func (j *Injector) Fired() []Fault {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.fired)
}

// Calls returns how many calls of kind k have reached the injector, the
// failed ones included (0 for a k that is not a device.Call).
func (j *Injector) Calls(k device.Call) int64 {
	if k >= device.NumCalls {
		return 0
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.calls[k]
}

// hooks numbers each call and fails it when a rule says so.
type hooks struct{ j *Injector }

func (h hooks) Before(k device.Call, _ uint64) error {
	j := h.j
	j.mu.Lock()
	defer j.mu.Unlock()
	j.calls[k]++
	n := j.calls[k]
	for _, r := range j.rules {
		if r.Call == k && n >= r.from && (r.to < 0 || n <= r.to) {
			err := r.Err
			if err == nil {
				err = ErrInjected
			}
			f := Fault{Call: k, Device: j.ordinal, N: n, Rule: r.id, Err: err}
			j.fired = append(j.fired, f)
			return &f
		}
	}
	return nil
}

func (hooks) After(device.Call, uint64, error) {}
