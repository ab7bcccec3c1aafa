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
	StreamWaiter  StreamWaiter
}

// CapabilitiesOf returns the capabilities d offers, each field d itself
// (the result of a type assertion), nil where d lacks it.
func CapabilitiesOf(d Device) Capabilities {
	var c Capabilities
	c.VirtualMemory, _ = d.(VirtualMemory)
	c.HostMemory, _ = d.(HostMemory)
	c.StreamChecker, _ = d.(StreamChecker)
	c.UsageReporter, _ = d.(UsageReporter)
	c.StreamWaiter, _ = d.(StreamWaiter)
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
	vm, h, c, u, w := caps.VirtualMemory, caps.HostMemory, caps.StreamChecker, caps.UsageReporter, caps.StreamWaiter
	var mask int
	for i, has := range []bool{vm != nil, h != nil, c != nil, u != nil, w != nil} {
		if has {
			mask |= 1 << i
		}
	}
	// One struct type per subset: embedding promotes exactly the methods
	// of the embedded interfaces, so a type assertion on the result sees
	// exactly the chosen capabilities. The method names of the six
	// interfaces are distinct, so no promotion is ambiguous.
	switch mask {
	case 0b00000:
		return struct{ Device }{base}
	case 0b00001:
		return struct {
			Device
			VirtualMemory
		}{base, vm}
	case 0b00010:
		return struct {
			Device
			HostMemory
		}{base, h}
	case 0b00011:
		return struct {
			Device
			VirtualMemory
			HostMemory
		}{base, vm, h}
	case 0b00100:
		return struct {
			Device
			StreamChecker
		}{base, c}
	case 0b00101:
		return struct {
			Device
			VirtualMemory
			StreamChecker
		}{base, vm, c}
	case 0b00110:
		return struct {
			Device
			HostMemory
			StreamChecker
		}{base, h, c}
	case 0b00111:
		return struct {
			Device
			VirtualMemory
			HostMemory
			StreamChecker
		}{base, vm, h, c}
	case 0b01000:
		return struct {
			Device
			UsageReporter
		}{base, u}
	case 0b01001:
		return struct {
			Device
			VirtualMemory
			UsageReporter
		}{base, vm, u}
	case 0b01010:
		return struct {
			Device
			HostMemory
			UsageReporter
		}{base, h, u}
	case 0b01011:
		return struct {
			Device
			VirtualMemory
			HostMemory
			UsageReporter
		}{base, vm, h, u}
	case 0b01100:
		return struct {
			Device
			StreamChecker
			UsageReporter
		}{base, c, u}
	case 0b01101:
		return struct {
			Device
			VirtualMemory
			StreamChecker
			UsageReporter
		}{base, vm, c, u}
	case 0b01110:
		return struct {
			Device
			HostMemory
			StreamChecker
			UsageReporter
		}{base, h, c, u}
	case 0b01111:
		return struct {
			Device
			VirtualMemory
			HostMemory
			StreamChecker
			UsageReporter
		}{base, vm, h, c, u}
	case 0b10000:
		return struct {
			Device
			StreamWaiter
		}{base, w}
	case 0b10001:
		return struct {
			Device
			VirtualMemory
			StreamWaiter
		}{base, vm, w}
	case 0b10010:
		return struct {
			Device
			HostMemory
			StreamWaiter
		}{base, h, w}
	case 0b10011:
		return struct {
			Device
			VirtualMemory
			HostMemory
			StreamWaiter
		}{base, vm, h, w}
	case 0b10100:
		return struct {
			Device
			StreamChecker
			StreamWaiter
		}{base, c, w}
	case 0b10101:
		return struct {
			Device
			VirtualMemory
			StreamChecker
			StreamWaiter
		}{base, vm, c, w}
	case 0b10110:
		return struct {
			Device
			HostMemory
			StreamChecker
			StreamWaiter
		}{base, h, c, w}
	case 0b10111:
		return struct {
			Device
			VirtualMemory
			HostMemory
			StreamChecker
			StreamWaiter
		}{base, vm, h, c, w}
	case 0b11000:
		return struct {
			Device
			UsageReporter
			StreamWaiter
		}{base, u, w}
	case 0b11001:
		return struct {
			Device
			VirtualMemory
			UsageReporter
			StreamWaiter
		}{base, vm, u, w}
	case 0b11010:
		return struct {
			Device
			HostMemory
			UsageReporter
			StreamWaiter
		}{base, h, u, w}
	case 0b11011:
		return struct {
			Device
			VirtualMemory
			HostMemory
			UsageReporter
			StreamWaiter
		}{base, vm, h, u, w}
	case 0b11100:
		return struct {
			Device
			StreamChecker
			UsageReporter
			StreamWaiter
		}{base, c, u, w}
	case 0b11101:
		return struct {
			Device
			VirtualMemory
			StreamChecker
			UsageReporter
			StreamWaiter
		}{base, vm, c, u, w}
	case 0b11110:
		return struct {
			Device
			HostMemory
			StreamChecker
			UsageReporter
			StreamWaiter
		}{base, h, c, u, w}
	default:
		return struct {
			Device
			VirtualMemory
			HostMemory
			StreamChecker
			UsageReporter
			StreamWaiter
		}{base, vm, h, c, u, w}
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
	if have.StreamWaiter != nil {
		caps.StreamWaiter = impl.StreamWaiter
	}
	return Compose(adaptor, caps)
}
