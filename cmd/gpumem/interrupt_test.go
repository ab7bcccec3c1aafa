//go:build unix

package main

// Ctrl-C on long work: the command is built, run with stderr on a pipe
// (not a terminal), shows its progress in lines, and stops at SIGINT or
// SIGTERM with one line and the status 128 + the signal's number, by
// itself rather than killed by the signal.

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writeLongTrace writes a memtrace of n allocations of varied sizes, each
// freed 64 allocations later: a trace that fit and tune take tens of
// seconds over.
func writeLongTrace(t *testing.T, path string, n int) {
	f, err := os.Create(path)
	require.NoError(t, err)
	w := bufio.NewWriter(f)
	fmt.Fprintln(w, "# memtrace v1 source=test")
	for i := range n {
		fmt.Fprintf(w, "a %d %d\n", i, (i*7919%997+1)*8192)
		if i >= 64 {
			fmt.Fprintf(w, "f %d\n", i-64)
		}
	}
	require.NoError(t, w.Flush())
	require.NoError(t, f.Close())
}

func TestInterruptStopsLongWork(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the command and runs it for seconds")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "gpumem")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	tr := filepath.Join(dir, "long.trace")
	writeLongTrace(t, tr, 200000)

	for _, c := range []struct {
		sig      syscall.Signal
		args     []string
		progress string
	}{
		{syscall.SIGINT, []string{"tune", "--jobs", "1", tr}, "configurations done"},
		// The trace ten times, under two configurations.
		{syscall.SIGTERM, append(append([]string{"fit"}, slices.Repeat([]string{tr}, 10)...), "--checks", "40"), "traces and configurations fitted"},
	} {
		t.Run(c.sig.String(), func(t *testing.T) {
			cmd := exec.Command(bin, c.args...)
			for _, v := range os.Environ() {
				if !strings.Contains(v, "ALLOC_CONF=") {
					cmd.Env = append(cmd.Env, v)
				}
			}
			stderr, err := cmd.StderrPipe()
			require.NoError(t, err)
			require.NoError(t, cmd.Start())
			defer cmd.Process.Kill()
			lines := make(chan string)
			go func() {
				defer close(lines)
				sc := bufio.NewScanner(stderr)
				for sc.Scan() {
					lines <- sc.Text()
				}
			}()
			name := "gpumem " + c.args[0] + ": "
			var seen []string
			// The configuration line, then a progress line within a few
			// seconds.
			deadline := time.After(60 * time.Second)
			for progressed := false; !progressed; {
				select {
				case l, ok := <-lines:
					require.True(t, ok, "the command ended before any progress: %q", seen)
					seen = append(seen, l)
					progressed = strings.HasPrefix(l, name) && strings.Contains(l, c.progress)
				case <-deadline:
					t.Fatalf("no progress line: %q", seen)
				}
			}
			require.True(t, strings.HasPrefix(seen[0], name+"configuration"), "%q", seen)
			sent := time.Now()
			require.NoError(t, cmd.Process.Signal(c.sig))
			var rest []string
			for l := range lines {
				if !strings.Contains(l, c.progress) {
					rest = append(rest, l)
				}
			}
			err = cmd.Wait()
			stopped := time.Since(sent)
			var ee *exec.ExitError
			require.True(t, errors.As(err, &ee), "%v", err)
			ws := ee.Sys().(syscall.WaitStatus)
			assert.False(t, ws.Signaled(), "the command stops by itself, not killed by the signal")
			assert.Equal(t, 128+int(c.sig), ws.ExitStatus())
			// Stopping by itself (not killed by the signal) is stopping
			// within interruptGrace: the command ends itself by the signal
			// past it. How long it took is logged, not asserted.
			t.Logf("stopped %v after the signal", stopped)
			sigName := map[syscall.Signal]string{syscall.SIGINT: "SIGINT", syscall.SIGTERM: "SIGTERM"}[c.sig]
			assert.Equal(t, []string{name + "interrupted by " + sigName}, rest, "one line")
		})
	}
}
