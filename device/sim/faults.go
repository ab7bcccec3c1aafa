// Fault injection: making Malloc, Map, Free, Unmap and event queries fail
// on demand.

package sim

import "fmt"

// faults are the failures a test has asked for. Guarded by Device.mu
// (FailMallocWhen's predicate lives in Device.when instead).
type faults struct {
	countdown int    // FailNthMalloc: fail when this reaches zero; 0 is off
	above     uint64 // FailMallocAbove; 0 is off
	freeErr   error  // FailFrees
	eventErr  error  // FailEventQueries
}

// mallocFault decides whether a Malloc or Map of size bytes, which has
// passed its argument checks, fails by injection. injected is what
// FailMallocWhen's predicate said. It returns the reason, or "".
func (f *faults) mallocFault(size uint64, injected bool) string {
	if f.countdown > 0 {
		f.countdown--
		if f.countdown == 0 {
			return "FailNthMalloc"
		}
	}
	if f.above != 0 && size > f.above {
		return fmt.Sprintf("FailMallocAbove(%d)", f.above)
	}
	if injected {
		return "FailMallocWhen"
	}
	return ""
}

// predicateSays runs FailMallocWhen's predicate, if any, without the lock.
func (d *Device) predicateSays(size uint64) bool {
	pred := d.when.Load()
	return pred != nil && (*pred)(size)
}

// FailNthMalloc makes the nth allocating call from now fail with
// device.ErrOutOfMemory, once (n = 1: the next one). Allocating calls are
// Malloc and Map calls that pass their argument checks; the countdown
// counts them together. n <= 0 turns it off.
func (d *Device) FailNthMalloc(n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.faults.countdown = max(n, 0)
}

// FailMallocAbove makes every Malloc or Map of more than size bytes (the
// size asked for, before page rounding) fail with device.ErrOutOfMemory;
// 0 turns it off.
func (d *Device) FailMallocAbove(size uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.faults.above = size
}

// FailMallocWhen makes Malloc and Map fail with device.ErrOutOfMemory
// whenever pred returns true for the size asked for; nil turns it off. pred
// is called once per Malloc or Map call, before the device's lock is
// taken, so it may call the device; it must be safe for concurrent use if
// the device is.
func (d *Device) FailMallocWhen(pred func(size uint64) bool) {
	if pred == nil {
		d.when.Store(nil)
		return
	}
	d.when.Store(&pred)
}

// FailFrees makes Free and Unmap of valid arguments return an error that
// wraps err, and free nothing; nil turns it off. Invalid arguments still
// fail with their own errors first.
func (d *Device) FailFrees(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.faults.freeErr = err
}

// FailEventQueries makes EventDone and SynchronizeEvent of existing events
// return an error that wraps err, and finish nothing; nil turns it off.
// Unknown events still fail with device.ErrInvalidEvent.
func (d *Device) FailEventQueries(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.faults.eventErr = err
}
