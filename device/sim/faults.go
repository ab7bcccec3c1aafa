// This file holds fault injection.

package sim

import (
	"errors"
	"fmt"
)

// faults are the failures a test has asked for. Guarded by Device.mu.
type faults struct {
	nthMalloc int64 // fail the Malloc/Map call with this sequence number; 0: off
	above     uint64
	when      func(size uint64) bool
	freeErr   error
	eventErr  error
}

// errInjected marks failures that fault injection caused.
var errInjected = errors.New("injected fault")

func (f *faults) mallocFault(call int64, size uint64) error {
	switch {
	case f.nthMalloc != 0 && call == f.nthMalloc:
		f.nthMalloc = 0
		return fmt.Errorf("%w: malloc call %d fails", errInjected, call)
	case f.above != 0 && size > f.above:
		return fmt.Errorf("%w: mallocs above %d bytes fail", errInjected, f.above)
	case f.when != nil && f.when(size):
		return fmt.Errorf("%w: malloc predicate", errInjected)
	}
	return nil
}

// FailNthMalloc makes the nth Malloc or Map call from now (1 = the next)
// fail with ErrOutOfMemory, once. n <= 0 turns it off.
func (d *Device) FailNthMalloc(n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if n <= 0 {
		d.faults.nthMalloc = 0
		return
	}
	d.faults.nthMalloc = d.mallocCall + int64(n)
}

// FailMallocAbove makes every Malloc or Map of more than size bytes fail
// with ErrOutOfMemory; 0 turns it off.
func (d *Device) FailMallocAbove(size uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.faults.above = size
}

// FailMallocWhen makes Malloc and Map fail with ErrOutOfMemory while pred
// returns true for the size; nil turns it off. pred is called with the
// device's lock held: it must not call the device.
func (d *Device) FailMallocWhen(pred func(size uint64) bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.faults.when = pred
}

// FailFrees makes Free (and Unmap) return err, wrapped, and free nothing;
// nil turns it off.
func (d *Device) FailFrees(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.faults.freeErr = err
}

// FailEventQueries makes EventDone and SynchronizeEvent return err,
// wrapped; nil turns it off.
func (d *Device) FailEventQueries(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.faults.eventErr = err
}
