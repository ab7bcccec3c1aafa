package freeindex

// The sizes the index's structures are built on (PyTorch's kMinBlockSize
// and kSmallBuffer; the allocator's rounding and segment sizes use the
// same).
const (
	MinBlockSize = 512     // every block's size is a multiple of this
	SmallBuffer  = 2 << 20 // the size of a small pool's plain segment
)
