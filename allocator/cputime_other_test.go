//go:build !unix

package allocator

import "time"

// cpuTime is not measured here.
func cpuTime() time.Duration { return 0 }
