// Adopted streams: a stream named by a runtime outside gpumem, as the CUDA
// backend adopts a driver stream, so that programs written for a
// runtime's own streams run, and are tested, on the simulated device.

package sim

import "github.com/gpumem/gpumem/device"

// The external names of the default streams, the same values as the CUDA
// backend's (CU_STREAM_LEGACY and CU_STREAM_PER_THREAD), so that code
// adopting them runs on either device.
const (
	// StreamLegacy names the legacy default stream: it adopts as
	// device.DefaultStream, as 0 does.
	StreamLegacy uintptr = 0x1
	// StreamPerThread names the per-thread default stream: it adopts as a
	// stream of its own. The simulation has no threads, so it is one
	// stream, whatever goroutine uses it.
	StreamPerThread uintptr = 0x2
)

// AdoptStreamHandle adopts the stream a runtime names h (on a GPU, its CUstream)
// as a device.Stream, as the CUDA backend's AdoptStreamHandle does: 0 and
// StreamLegacy give device.DefaultStream; any other name gets a stream of
// its own, numbered after the streams made so far (like NewStream's), that
// HasStream accepts until ReleaseStream. Adopting a name already adopted
// returns the same stream. Adoption costs and counts nothing: the stream
// exists already.
func (d *Device) AdoptStreamHandle(h uintptr) (device.Stream, error) {
	if h == 0 || h == StreamLegacy {
		return device.DefaultStream, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if i, ok := d.adopted[h]; ok {
		return d.streamHandle(i), nil
	}
	if len(d.streams) > maxStreams {
		return 0, d.fail("adopt stream", device.ErrInvalidArgument, "device %d has %d streams, the most it can number", d.ordinal, len(d.streams))
	}
	d.streams = append(d.streams, streamState{external: h})
	i := len(d.streams) - 1
	d.adopted[h] = i
	return d.streamHandle(i), nil
}

// maxStreams is the most streams a device numbers: the index must fit the
// low 32 bits of a handle.
const maxStreams = 1<<32 - 2

// ReleaseStream forgets an adopted stream: its handle becomes invalid (its
// number is not reused) and the name may be adopted again, as a new
// stream. Work recorded on it before stays as it was: Synchronize still
// finishes it. Releasing device.DefaultStream does nothing; a stream made
// by NewStream, or a handle that is not an adopted stream, fails with
// device.ErrInvalidStream.
func (d *Device) ReleaseStream(s device.Stream) error {
	if s == device.DefaultStream {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	i, ok := d.streamIndex(s)
	if !ok || i == 0 || d.streams[i].external == 0 {
		why := "it is not an adopted stream of this device, or was released"
		if ok {
			why = "it was made by NewStream and lives as long as the device"
		}
		return d.fail("release stream", device.ErrInvalidStream, "stream %#x: %s", uint64(s), why)
	}
	delete(d.adopted, d.streams[i].external)
	d.streams[i].released = true
	return nil
}

// StreamHandle returns the external name an adopted stream was adopted
// under (0 for device.DefaultStream), as the CUDA backend returns the
// driver stream to launch on. A stream made by NewStream has no external
// name and fails with device.ErrInvalidStream, as do unknown and released
// handles.
func (d *Device) StreamHandle(s device.Stream) (uintptr, error) {
	if s == device.DefaultStream {
		return 0, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	i, ok := d.streamIndex(s)
	if !ok || d.streams[i].external == 0 {
		why := "it is not an adopted stream of this device, or was released"
		if ok {
			why = "it was made by NewStream and has no external name"
		}
		return 0, d.fail("stream handle", device.ErrInvalidStream, "stream %#x: %s", uint64(s), why)
	}
	return d.streams[i].external, nil
}
