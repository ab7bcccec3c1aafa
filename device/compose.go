// Capability sets, and Devices built with exactly the capabilities asked
// for: what adaptors hand out.

package device

//go:generate go run ./internal/composegen .

// Capabilities is a set of optional capabilities: each non-nil field is
// one the set offers.
type Capabilities struct {
	VirtualMemory VirtualMemory
	HostMemory    HostMemory
	StreamChecker StreamChecker
	UsageReporter UsageReporter
	StreamWaiter  StreamWaiter
	Copier        Copier
	// StreamOrderedMemory is the device's stream-ordered pool.
	StreamOrderedMemory StreamOrderedMemory
	// ProgressReporter says which streams ran work since an earlier
	// moment.
	ProgressReporter ProgressReporter
}

// CapabilitiesOf returns the capabilities d offers, each field d itself
// (the result of a type assertion), nil where d lacks it.
func CapabilitiesOf(d Device) Capabilities { return capabilitiesOf(d) }

// Compose returns a Device whose Device methods are base's and whose
// optional capabilities are exactly the non-nil fields of caps, each
// served by that field. Capabilities of base itself are not offered unless
// caps names them. Compose(nil, caps) is nil.
//
// A test can use it to take a capability away from a backend:
//
//	noVM := device.Compose(sim, device.Capabilities{HostMemory: sim})
//
// The result is one struct type per subset of capabilities (written by
// composegen into compose_gen.go, the cases into compose_gen0.go to
// compose_gen3.go): embedding promotes exactly the methods of the
// embedded interfaces, so a type assertion on the result sees
// exactly the chosen capabilities. The method names of the capability
// interfaces and Device are distinct, so no promotion is ambiguous.
func Compose(base Device, caps Capabilities) Device {
	if base == nil {
		return nil
	}
	return compose(base, caps)
}

// WithCapabilitiesOf returns the Device an adaptor hands out: adaptor's
// methods, offering each capability that inner offers and adaptor
// implements, and no other. An adaptor that implements every capability
// (forwarding each to inner) thereby offers exactly inner's. If adaptor or
// inner is nil, the result is nil.
func WithCapabilitiesOf(adaptor, inner Device) Device {
	if adaptor == nil || inner == nil {
		return nil
	}
	return Compose(adaptor, CapabilitiesOf(inner).offeredBy(CapabilitiesOf(adaptor)))
}
