// background.go: the goroutine that checks the events of freed blocks
// (UseBackgroundThreads), and the page touching of UseHostRegister.

package host

import (
	"sync"
	"time"
)

// backgroundInterval is how often the background goroutine checks the
// events of freed blocks: PyTorch's 100 µs sleep.
const backgroundInterval = 100 * time.Microsecond

// startBackgroundLocked starts the goroutine that checks events, unless it
// runs already or the allocator is closed.
func (a *Allocator) startBackgroundLocked() {
	if a.bgStop != nil || a.closed {
		return
	}
	stop, done := make(chan struct{}), make(chan struct{})
	a.bgStop, a.bgDone = stop, done
	go func() {
		defer close(done)
		t := time.NewTicker(backgroundInterval)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				a.mu.Lock()
				if a.events.Len() > 0 {
					a.events.Poll(a.completeLocked)
				}
				a.mu.Unlock()
			}
		}
	}()
}

// touchPages writes a zero byte in every 4 KiB page of mem, split in
// threads equal parts touched at once, as PyTorch touches memory before
// registering it so that the registration does not fault pages in under
// the driver's lock.
func touchPages(mem []byte, threads int) {
	if len(mem) == 0 {
		return
	}
	part := func(i int) {
		lo := len(mem) * i / threads
		hi := len(mem) * (i + 1) / threads
		for p := lo; p < hi; p += pageSize {
			mem[p] = 0
		}
		if hi > lo {
			mem[hi-1] = 0
		}
	}
	if threads <= 1 {
		part(0)
		return
	}
	var wg sync.WaitGroup
	for i := range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			part(i)
		}()
	}
	wg.Wait()
}
