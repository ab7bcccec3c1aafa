package device_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/gpumem/gpumem/device"
)

func TestPtrString(t *testing.T) {
	assert.Equal(t, "0x0", device.Ptr(0).String())
	assert.Equal(t, "0x100000000000", device.Ptr(1<<44).String())
}

func TestError(t *testing.T) {
	for _, c := range []struct {
		err  device.Error
		want string
	}{
		{device.Error{Op: "malloc", Device: 1, Err: device.ErrOutOfMemory}, "device 1: malloc: out of memory"},
		{device.Error{Op: "free", Err: device.ErrInvalidPointer, Message: "0x10 was not allocated"},
			"device 0: free: invalid device pointer (0x10 was not allocated)"},
		{device.Error{Op: "map", Device: 2, Err: device.ErrOutOfMemory, Code: 2, Message: "CUDA_ERROR_OUT_OF_MEMORY"},
			"device 2: map: out of memory (CUDA_ERROR_OUT_OF_MEMORY, code 2)"},
	} {
		err := &c.err
		assert.Equal(t, c.want, err.Error())
		assert.ErrorIs(t, err, c.err.Err)
		var de *device.Error
		assert.True(t, errors.As(err, &de))
	}
}
