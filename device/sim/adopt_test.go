// Tests of adopted streams.

package sim

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/device"
)

func TestAdoptStream(t *testing.T) {
	d := mustNew(t, Config{Ordinal: 1})
	made, err := d.NewStream()
	require.NoError(t, err)

	for _, h := range []uintptr{0, StreamLegacy} {
		s, err := d.AdoptStreamHandle(h)
		require.NoError(t, err)
		assert.Equal(t, device.DefaultStream, s)
	}
	s, err := d.AdoptStreamHandle(0xabc0)
	require.NoError(t, err)
	assert.Equal(t, device.Stream(1<<32|2), s, "numbered after the streams made so far, with the ordinal")
	again, err := d.AdoptStreamHandle(0xabc0)
	require.NoError(t, err)
	assert.Equal(t, s, again)
	assert.True(t, d.HasStream(s))
	h, err := d.StreamHandle(s)
	require.NoError(t, err)
	assert.Equal(t, uintptr(0xabc0), h)
	h, err = d.StreamHandle(device.DefaultStream)
	require.NoError(t, err)
	assert.Zero(t, h)
	pt, err := d.AdoptStreamHandle(StreamPerThread)
	require.NoError(t, err)
	assert.NotEqual(t, s, pt)
	assert.Equal(t, 4, d.Streams())
	assert.Equal(t, int64(1), d.Counters().StreamsCreated, "adoption creates nothing")

	// An adopted stream is a stream like any other.
	require.NoError(t, d.SetStreamBusy(s, true))
	e, err := d.RecordEvent(s)
	require.NoError(t, err)
	done, err := d.EventDone(e)
	require.NoError(t, err)
	assert.False(t, done)
	require.NoError(t, d.WaitEvent(made, e))

	// Release forgets the handle; the name adopts anew.
	require.NoError(t, d.ReleaseStream(s))
	assert.False(t, d.HasStream(s))
	_, err = d.RecordEvent(s)
	assert.ErrorIs(t, err, device.ErrInvalidStream)
	_, err = d.StreamHandle(s)
	assert.ErrorIs(t, err, device.ErrInvalidStream)
	assert.ErrorIs(t, d.ReleaseStream(s), device.ErrInvalidStream)
	require.NoError(t, d.Synchronize())
	done, err = d.EventDone(e)
	require.NoError(t, err)
	assert.True(t, done, "work recorded before the release still finishes")
	s2, err := d.AdoptStreamHandle(0xabc0)
	require.NoError(t, err)
	assert.NotEqual(t, s, s2, "a released number is not reused")

	// Streams the device made are not adopted ones.
	assert.ErrorIs(t, d.ReleaseStream(made), device.ErrInvalidStream)
	assert.True(t, d.HasStream(made), "a failed release changes nothing")
	_, err = d.StreamHandle(made)
	assert.ErrorIs(t, err, device.ErrInvalidStream)
	assert.NoError(t, d.ReleaseStream(device.DefaultStream))
	for _, bad := range []device.Stream{99, 1<<32 | 99, 2<<32 | 2} {
		assert.ErrorIs(t, d.ReleaseStream(bad), device.ErrInvalidStream, "%#x", uint64(bad))
		_, err := d.StreamHandle(bad)
		assert.ErrorIs(t, err, device.ErrInvalidStream)
	}
}
