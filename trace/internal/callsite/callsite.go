// Package callsite turns the Go call stacks that the recorders keep
// (program counters from runtime.Callers, taken in an allocator observer)
// into frames and call sites, without the library's own frames.
//
// An observer runs in the goroutine that called the allocator, so the
// stack it captures starts inside the library: the observer, the
// allocator's ledger, Alloc or Free, and, in a replay, the replay loop.
// Those leading frames say nothing about who asked for the memory; Stack
// drops them, so that a stack starts at the caller's code, and Site names
// that first frame. A frame is the library's own when its function belongs
// to a package of this module and its file is not a test file (the
// module's tests and examples are callers like any other).
package callsite

import (
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

// modulePrefix starts the name of every function of this module's
// packages (package main functions are named main.F, and so are callers).
const modulePrefix = "github.com/gpumem/gpumem/"

// Frame is one frame of a Go call stack.
type Frame struct {
	Function string // the package-qualified function name, as runtime.Frame has it
	File     string // the full path of the source file
	Line     int
}

// String returns "function (file:line)" with the file's base name: a call
// site as an out-of-memory error lists it.
func (f Frame) String() string {
	return f.Function + " (" + filepath.Base(f.File) + ":" + strconv.Itoa(f.Line) + ")"
}

// Library reports whether f is the library's own code.
func Library(f Frame) bool {
	return strings.HasPrefix(f.Function, modulePrefix) && !strings.HasSuffix(f.File, "_test.go")
}

// Cache symbolizes program counters and remembers each answer. It is not
// safe for concurrent use: its owner guards it.
type Cache struct {
	pcs map[uintptr][]Frame
}

// frames returns the frames of one return address: one, or more where
// calls were inlined into it, innermost first.
func (c *Cache) frames(pc uintptr) []Frame {
	if fs, ok := c.pcs[pc]; ok {
		return fs
	}
	if c.pcs == nil {
		c.pcs = make(map[uintptr][]Frame)
	}
	var fs []Frame
	it := runtime.CallersFrames([]uintptr{pc})
	for {
		fr, more := it.Next()
		if fr.Function != "" || fr.File != "" {
			fs = append(fs, Frame{Function: fr.Function, File: fr.File, Line: fr.Line})
		}
		if !more {
			break
		}
	}
	c.pcs[pc] = fs
	return fs
}

// Stack returns the frames of a stack captured by runtime.Callers,
// innermost first, without its leading library frames and without
// runtime.goexit, the bottom of every goroutine. A stack of library
// frames alone is returned whole.
func (c *Cache) Stack(pcs []uintptr) []Frame {
	var out []Frame
	first := -1 // the first frame outside the library
	for _, pc := range pcs {
		for _, f := range c.frames(pc) {
			if f.Function == "runtime.goexit" {
				continue
			}
			if first < 0 && !Library(f) {
				first = len(out)
			}
			out = append(out, f)
		}
	}
	if first < 0 {
		return out
	}
	return out[first:]
}

// Site returns the first frame of a stack that is not the library's own,
// and false when there is none.
func (c *Cache) Site(pcs []uintptr) (Frame, bool) {
	for _, pc := range pcs {
		for _, f := range c.frames(pc) {
			if !Library(f) {
				return f, true
			}
		}
	}
	return Frame{}, false
}
