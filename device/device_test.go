package device_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/gpumem/gpumem/device"
)

func TestPtrString(t *testing.T) {
	assert.Equal(t, "0x0", device.Ptr(0).String())
	assert.Equal(t, "0x100000000000", device.Ptr(1<<44).String())
}

func TestPtrFormat(t *testing.T) {
	p := device.Ptr(0x2a)
	for format, want := range map[string]string{
		"%v":    "0x2a",
		"%s":    "0x2a",
		"%+v":   "0x2a",
		"%#v":   "0x2a",
		"%8v":   "    0x2a",
		"%-6s|": "0x2a  |",
		"%q":    `"0x2a"`,
		"%x":    "2a",
		"%#x":   "0x2a",
		"%X":    "2A",
		"%#X":   "0X2A",
		"%08x":  "0000002a",
		"%d":    "42",
		"%5d":   "   42",
		"%o":    "52",
		"%b":    "101010",
	} {
		assert.Equal(t, want, fmt.Sprintf(format, p), format)
	}
	assert.Equal(t, "[0x1 0x2]", fmt.Sprint([]device.Ptr{1, 2}))
	assert.Equal(t, "0x100000000000", fmt.Sprintf("%#x", device.Ptr(1<<44)))
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
