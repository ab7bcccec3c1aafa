//go:build cuda

// waitstream_stub_test.go: WaitStream against the stub driver: the record
// and the wait it makes, the one event it keeps and reuses, its errors,
// and Close destroying that event.

package cuda

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/cuda/internal/cudastub"
)

// twoStreams makes two streams on d.
func twoStreams(t *testing.T, d *Device) (a, b device.Stream) {
	t.Helper()
	a, err := d.NewStream()
	require.NoError(t, err)
	b, err = d.NewStream()
	require.NoError(t, err)
	return a, b
}

// waitCalls counts the driver calls WaitStream can make.
type waitCalls struct{ create, record, wait, destroy int }

func stubWaitCalls() waitCalls {
	return waitCalls{
		create:  cudastub.Calls("cuEventCreate"),
		record:  cudastub.Calls("cuEventRecord"),
		wait:    cudastub.Calls("cuStreamWaitEvent"),
		destroy: cudastub.Calls("cuEventDestroy"),
	}
}

// TestStubWaitStream: the first WaitStream creates an event without
// timing, records it on the awaited stream and makes the waiting stream
// wait on it; later calls record and wait on the same event, whatever the
// streams; the wait holds the waiting stream's work behind the awaited
// stream's, and the caller has no event to release.
func TestStubWaitStream(t *testing.T) {
	d := openStub(t)
	var w device.StreamWaiter = d
	a, b := twoStreams(t, d)

	cudastub.HoldEvents(true)
	ea := mustRecord(t, d, a) // work queued on a, not done
	before := stubWaitCalls()
	require.NoError(t, w.WaitStream(b, a))
	after := stubWaitCalls()
	assert.Equal(t, waitCalls{create: before.create + 1, record: before.record + 1, wait: before.wait + 1, destroy: before.destroy}, after,
		"one event created, recorded and waited on")
	assert.Zero(t, cudastub.TimedEvents(), "the kept event is created with CU_EVENT_DISABLE_TIMING")
	assert.Equal(t, 2, cudastub.Live("event"), "the caller's event and the kept one")
	assert.Equal(t, 1, cudastub.Live("wait"), "b waits for a's work")

	// The wait is b's on a's work: synchronizing a leaves it, synchronizing
	// b runs a's work first.
	eb := mustRecord(t, d, b)
	require.NoError(t, d.SynchronizeStream(a))
	assert.Equal(t, 1, cudastub.Live("wait"), "synchronizing a does not pass b's wait")
	ea2 := mustRecord(t, d, a)
	require.NoError(t, d.SynchronizeStream(b))
	assert.Zero(t, cudastub.Live("wait"))
	assert.True(t, mustDone(t, d, ea2), "b waited for a: synchronizing b ran a's work")
	assert.True(t, mustDone(t, d, eb))

	// Later calls, on any pair of streams, reuse the event.
	pairs := [][2]device.Stream{{b, a}, {device.DefaultStream, b}, {a, device.DefaultStream}, {b, a}}
	before = stubWaitCalls()
	for _, p := range pairs {
		require.NoError(t, w.WaitStream(p[0], p[1]))
	}
	after = stubWaitCalls()
	n := len(pairs)
	assert.Equal(t, waitCalls{create: before.create, record: before.record + n, wait: before.wait + n, destroy: before.destroy}, after,
		"no event is created or destroyed after the first call")
	assert.Equal(t, 4, cudastub.Live("event"), "the caller's three events and the kept one")
	require.NoError(t, d.Synchronize())

	// Waiting on oneself reaches no driver call.
	before = stubWaitCalls()
	require.NoError(t, w.WaitStream(b, b))
	require.NoError(t, w.WaitStream(device.DefaultStream, device.DefaultStream))
	assert.Equal(t, before, stubWaitCalls())

	for _, e := range []device.Event{ea, eb, ea2} {
		require.NoError(t, d.ReleaseEvent(e))
	}
	assert.Equal(t, 1, cudastub.Live("event"), "only the kept event is left")
}

// TestStubWaitStreamErrors: unknown or foreign streams, on either side
// (and on both, even when they are the same handle), fail with
// ErrInvalidStream before the driver sees them; a driver failure of the
// create, the record or the wait keeps its code, changes nothing the next
// call depends on, and leaves no extra event.
func TestStubWaitStreamErrors(t *testing.T) {
	d := openStub(t)
	a, b := twoStreams(t, d)

	before := stubWaitCalls()
	for _, p := range [][2]device.Stream{{b + 1000, a}, {a, b + 1000}, {b + 1000, b + 1000}, {1<<32 | a, a}, {a, 1<<32 | a}} {
		requireDeviceError(t, d.WaitStream(p[0], p[1]), device.ErrInvalidStream, 0)
	}
	assert.Equal(t, before, stubWaitCalls(), "unknown handles never reach the driver")
	assert.Zero(t, cudastub.Live("event"), "no event is made for a call that fails")

	// A failed create leaves nothing behind; the next call creates it.
	require.True(t, cudastub.FailNext("cuEventCreate", 2)) // CUDA_ERROR_OUT_OF_MEMORY
	requireDeviceError(t, d.WaitStream(b, a), device.ErrOutOfMemory, 2)
	assert.Zero(t, cudastub.Live("event"))
	require.NoError(t, d.WaitStream(b, a))
	assert.Equal(t, 1, cudastub.Live("event"))

	// A failed record or wait keeps the event for the next call.
	creates := cudastub.Calls("cuEventCreate")
	require.True(t, cudastub.FailNext("cuEventRecord", 400)) // CUDA_ERROR_INVALID_HANDLE
	requireDeviceError(t, d.WaitStream(b, a), device.ErrInvalidStream, 400)
	require.True(t, cudastub.FailNext("cuStreamWaitEvent", 400))
	requireDeviceError(t, d.WaitStream(b, a), device.ErrInvalidStream, 400)
	require.True(t, cudastub.FailNext("cuStreamWaitEvent", 700)) // CUDA_ERROR_ILLEGAL_ADDRESS
	requireDeviceError(t, d.WaitStream(b, a), ErrDriver, 700)
	require.NoError(t, d.WaitStream(b, a), "once only")
	assert.Equal(t, creates, cudastub.Calls("cuEventCreate"))
	assert.Equal(t, 1, cudastub.Live("event"))
}

// TestStubWaitStreamConcurrent: WaitStream from many goroutines, on
// overlapping pairs of streams, creates the event once and makes one
// record and one wait per call.
func TestStubWaitStreamConcurrent(t *testing.T) {
	d := openStub(t)
	streams := []device.Stream{device.DefaultStream}
	for range 4 {
		s, err := d.NewStream()
		require.NoError(t, err)
		streams = append(streams, s)
	}
	const goroutines, calls = 8, 50
	before := stubWaitCalls()
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				s := streams[(g+i)%len(streams)]
				u := streams[(g+2*i+1)%len(streams)]
				if s == u {
					u = streams[(g+2*i+2)%len(streams)]
				}
				if err := d.WaitStream(s, u); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	after := stubWaitCalls()
	assert.Equal(t, before.create+1, after.create, "one event for every call")
	assert.Equal(t, before.record+goroutines*calls, after.record)
	assert.Equal(t, before.wait+goroutines*calls, after.wait)
	assert.Equal(t, 1, cudastub.Live("event"))
}

// TestStubCloseDestroysWaitEvent: Close destroys the event WaitStream
// kept, and a device that never waited on a stream destroys no event it
// did not make; WaitStream after Close fails with ErrClosed.
func TestStubCloseDestroysWaitEvent(t *testing.T) {
	t.Run("after WaitStream", func(t *testing.T) {
		d := openStub(t)
		s, err := d.NewStream()
		require.NoError(t, err)
		require.NoError(t, d.WaitStream(s, device.DefaultStream))
		require.NoError(t, d.WaitStream(device.DefaultStream, s))
		assert.Equal(t, 1, cudastub.Live("event"))
		destroys := cudastub.Calls("cuEventDestroy")
		require.NoError(t, d.Close())
		assert.Equal(t, destroys+1, cudastub.Calls("cuEventDestroy"))
		assert.Zero(t, cudastub.Live("event"))
		requireDeviceError(t, d.WaitStream(s, device.DefaultStream), ErrClosed, 0)
		require.NoError(t, d.Close(), "a second Close does nothing")
		assert.Equal(t, destroys+1, cudastub.Calls("cuEventDestroy"))
	})
	t.Run("without WaitStream", func(t *testing.T) {
		d := openStub(t)
		s, err := d.NewStream()
		require.NoError(t, err)
		e := mustRecord(t, d, s)
		require.NoError(t, d.WaitEvent(device.DefaultStream, e))
		require.NoError(t, d.WaitStream(s, s)) // no driver call, so no event
		destroys := cudastub.Calls("cuEventDestroy")
		require.NoError(t, d.Close())
		assert.Equal(t, destroys+1, cudastub.Calls("cuEventDestroy"), "only RecordEvent's event")
		assert.Zero(t, cudastub.Live("event"))
	})
	t.Run("after a failed create", func(t *testing.T) {
		d := openStub(t)
		require.True(t, cudastub.FailNext("cuEventCreate", 2))
		requireDeviceError(t, d.WaitStream(device.DefaultStream, mustStream(t, d)), device.ErrOutOfMemory, 2)
		destroys := cudastub.Calls("cuEventDestroy")
		require.NoError(t, d.Close())
		assert.Equal(t, destroys, cudastub.Calls("cuEventDestroy"), "no event to destroy")
	})
}

// mustStream creates a stream on d, failing the test on an error.
func mustStream(t *testing.T, d *Device) device.Stream {
	t.Helper()
	s, err := d.NewStream()
	require.NoError(t, err)
	return s
}
