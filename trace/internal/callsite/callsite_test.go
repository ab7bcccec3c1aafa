package callsite

import (
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestModulePrefix(t *testing.T) {
	assert.True(t, strings.HasPrefix(reflect.TypeOf(Frame{}).PkgPath()+"/", modulePrefix),
		"modulePrefix names this module")
}

func TestLibrary(t *testing.T) {
	assert.True(t, Library(Frame{Function: "github.com/gpumem/gpumem/allocator.(*Allocator).Alloc", File: "/src/allocator/allocator.go"}))
	assert.False(t, Library(Frame{Function: "github.com/gpumem/gpumem/allocator.TestAlloc", File: "/src/allocator/allocator_test.go"}), "tests are callers")
	assert.False(t, Library(Frame{Function: "main.train", File: "/src/train/main.go"}))
	assert.False(t, Library(Frame{Function: "example.com/model.(*Layer).Forward", File: "/src/model/layer.go"}))
	assert.Equal(t, "main.train (main.go:12)", Frame{Function: "main.train", File: "/src/train/main.go", Line: 12}.String())
}

//go:noinline
func captureHere() []uintptr {
	pcs := make([]uintptr, 32)
	return pcs[:runtime.Callers(1, pcs)]
}

func TestStackAndSite(t *testing.T) {
	pcs := captureHere()
	var c Cache
	frames := c.Stack(pcs)
	require.NotEmpty(t, frames)
	assert.Contains(t, frames[0].Function, "captureHere", "a test file's frames are the caller's")
	assert.True(t, strings.HasSuffix(frames[0].File, "callsite_test.go"))
	for _, f := range frames {
		assert.NotEqual(t, "runtime.goexit", f.Function)
	}
	site, ok := c.Site(pcs)
	require.True(t, ok)
	assert.Equal(t, frames[0], site)
	assert.Equal(t, frames, c.Stack(pcs), "the cache answers the same")
	_, ok = c.Site(nil)
	assert.False(t, ok)
	assert.Empty(t, c.Stack(nil))
}
