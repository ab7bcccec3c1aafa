// Capability sets, and Devices built with exactly the capabilities asked
// for: what adaptors hand out.

package device

// Capabilities is a set of optional capabilities: each non-nil field is
// one the set offers.
type Capabilities struct {
	VirtualMemory VirtualMemory
	HostMemory    HostMemory
	StreamChecker StreamChecker
	UsageReporter UsageReporter
}

// CapabilitiesOf returns the capabilities d offers, each field d itself
// (the result of a type assertion), nil where d lacks it.
func CapabilitiesOf(d Device) Capabilities {
	var c Capabilities
	c.VirtualMemory, _ = d.(VirtualMemory)
	c.HostMemory, _ = d.(HostMemory)
	c.StreamChecker, _ = d.(StreamChecker)
	c.UsageReporter, _ = d.(UsageReporter)
	return c
}

// Compose returns a Device whose Device methods are base's and whose
// optional capabilities are exactly the non-nil fields of caps, each
// served by that field. Capabilities of base itself are not offered unless
// caps names them. Compose(nil, caps) is nil.
//
// A test can use it to take a capability away from a backend:
//
//	noVM := device.Compose(sim, device.Capabilities{HostMemory: sim})
func Compose(base Device, caps Capabilities) Device {
	if base == nil {
		return nil
	}
	vm, h, c, u := caps.VirtualMemory, caps.HostMemory, caps.StreamChecker, caps.UsageReporter
	var mask int
	for i, has := range []bool{vm != nil, h != nil, c != nil, u != nil} {
		if has {
			mask |= 1 << i
		}
	}
	// One struct type per subset: embedding promotes exactly the methods
	// of the embedded interfaces, so a type assertion on the result sees
	// exactly the chosen capabilities. The method names of the five
	// interfaces are distinct, so no promotion is ambiguous.
	switch mask {
	case 0b0000:
		return struct{ Device }{base}
	case 0b0001:
		return struct {
			Device
			VirtualMemory
		}{base, vm}
	case 0b0010:
		return struct {
			Device
			HostMemory
		}{base, h}
	case 0b0011:
		return struct {
			Device
			VirtualMemory
			HostMemory
		}{base, vm, h}
	case 0b0100:
		return struct {
			Device
			StreamChecker
		}{base, c}
	case 0b0101:
		return struct {
			Device
			VirtualMemory
			StreamChecker
		}{base, vm, c}
	case 0b0110:
		return struct {
			Device
			HostMemory
			StreamChecker
		}{base, h, c}
	case 0b0111:
		return struct {
			Device
			VirtualMemory
			HostMemory
			StreamChecker
		}{base, vm, h, c}
	case 0b1000:
		return struct {
			Device
			UsageReporter
		}{base, u}
	case 0b1001:
		return struct {
			Device
			VirtualMemory
			UsageReporter
		}{base, vm, u}
	case 0b1010:
		return struct {
			Device
			HostMemory
			UsageReporter
		}{base, h, u}
	case 0b1011:
		return struct {
			Device
			VirtualMemory
			HostMemory
			UsageReporter
		}{base, vm, h, u}
	case 0b1100:
		return struct {
			Device
			StreamChecker
			UsageReporter
		}{base, c, u}
	case 0b1101:
		return struct {
			Device
			VirtualMemory
			StreamChecker
			UsageReporter
		}{base, vm, c, u}
	case 0b1110:
		return struct {
			Device
			HostMemory
			StreamChecker
			UsageReporter
		}{base, h, c, u}
	default:
		return struct {
			Device
			VirtualMemory
			HostMemory
			StreamChecker
			UsageReporter
		}{base, vm, h, c, u}
	}
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
	have := CapabilitiesOf(inner)
	impl := CapabilitiesOf(adaptor)
	var caps Capabilities
	if have.VirtualMemory != nil {
		caps.VirtualMemory = impl.VirtualMemory
	}
	if have.HostMemory != nil {
		caps.HostMemory = impl.HostMemory
	}
	if have.StreamChecker != nil {
		caps.StreamChecker = impl.StreamChecker
	}
	if have.UsageReporter != nil {
		caps.UsageReporter = impl.UsageReporter
	}
	return Compose(adaptor, caps)
}
