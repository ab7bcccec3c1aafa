//go:build cuda

// errors.go: how driver results become errors of the device package.

package cuda

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/device/cuda/internal/cudadrv"
)

// Errors of this backend that the device package has no sentinel for. Like
// the device sentinels they arrive wrapped in a *device.Error.
var (
	// ErrNoDevice: the driver could not be initialized, reports no device,
	// or has no device of the requested ordinal.
	ErrNoDevice = errors.New("no usable CUDA device")
	// ErrClosed: the Device was closed.
	ErrClosed = errors.New("device closed")
	// ErrDriver: the driver failed for a reason that is not a bad argument
	// (an earlier kernel fault, a lost device, ...); Code and Message of the
	// *device.Error say which.
	ErrDriver = errors.New("CUDA driver error")
)

// codeUnknown stands for CUDA_ERROR_UNKNOWN when an error carries no
// CUresult.
const codeUnknown = 999

// subject says what the argument of a failed call was, to choose between
// the device package's sentinels when the driver says "invalid value" or
// "invalid handle".
type subject int

const (
	subjectNone    subject = iota // no argument the caller chose
	subjectSize                   // a size (Malloc, HostAlloc)
	subjectPointer                // an address to free
	subjectStream                 // a stream handle
	subjectEvent                  // an event handle
	subjectRange                  // a virtual-memory range
)

// codeOf extracts the CUresult from an error of gorgonia.org/cu, whose
// error type is an unexported integer type; nil is 0 (CUDA_SUCCESS).
func codeOf(err error) int {
	if err == nil {
		return cudadrv.Success
	}
	if v := reflect.ValueOf(err); v.Kind() == reflect.Int {
		return int(v.Int())
	}
	return codeUnknown
}

// sentinel maps a CUresult to the sentinel error it is a case of.
func sentinel(code int, s subject) error {
	switch code {
	case cudadrv.ErrOutOfMemory:
		return device.ErrOutOfMemory
	case cudadrv.ErrInvalidValue, cudadrv.ErrInvalidHandle:
		switch s {
		case subjectSize:
			return device.ErrInvalidSize
		case subjectPointer:
			return device.ErrInvalidPointer
		case subjectStream:
			return device.ErrInvalidStream
		case subjectEvent:
			return device.ErrInvalidEvent
		}
		return device.ErrInvalidArgument
	case cudadrv.ErrNotSupported, 800: // CUDA_ERROR_NOT_PERMITTED
		return device.ErrNotSupported
	case cudadrv.ErrNoDevice, cudadrv.ErrInvalidDevice, cudadrv.ErrNotInitialized, 4: // CUDA_ERROR_DEINITIALIZED
		return ErrNoDevice
	}
	return ErrDriver
}

// driverText is the driver's name and description of a CUresult, as in
// "CUDA_ERROR_OUT_OF_MEMORY: out of memory".
func driverText(code int) string {
	name, text := cudadrv.ErrorName(code), cudadrv.ErrorString(code)
	switch {
	case name != "" && text != "":
		return name + ": " + text
	case name != "":
		return name
	case text != "":
		return text
	}
	return fmt.Sprintf("CUresult %d", code)
}

// driverError is the error for a failed driver call of operation op on
// device ordinal.
func driverError(op string, ordinal, code int, s subject) error {
	return &device.Error{Op: op, Device: ordinal, Code: code, Message: driverText(code), Err: sentinel(code, s)}
}

// usageError is the error for a call this package refuses before reaching
// the driver.
func usageError(op string, ordinal int, err error, format string, args ...any) error {
	return &device.Error{Op: op, Device: ordinal, Message: fmt.Sprintf(format, args...), Err: err}
}
