package main

import (
	"bufio"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestProgressLines: off a terminal, progress comes as lines on stderr,
// and none follows stop.
func TestProgressLines(t *testing.T) {
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	require.Equal(t, w, lineOutput(w), "a pipe gets lines")
	var buf strings.Builder
	assert.Nil(t, lineOutput(&buf), "a writer that is not a file gets none")
	assert.Nil(t, lineOutput(nil))

	defer func(d time.Duration) { progressEvery = d }(progressEvery)
	progressEvery = 5 * time.Millisecond
	var n atomic.Int64
	stop := startProgress(w, "gpumem test", func() string { return strings.Repeat("x", int(n.Add(1))) })
	sc := bufio.NewScanner(r)
	require.True(t, sc.Scan())
	assert.Regexp(t, `^gpumem test: x \(\d+s\)$`, sc.Text())
	require.True(t, sc.Scan())
	assert.True(t, strings.HasPrefix(sc.Text(), "gpumem test: xx "), sc.Text())
	stop()
	after := n.Load()
	time.Sleep(20 * time.Millisecond)
	assert.Equal(t, after, n.Load(), "no line after stop")
	w.Close()

	startProgress(nil, "x", func() string { panic("never called") })()
}
