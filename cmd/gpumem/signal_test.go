//go:build unix

package main

// Signals on the command, in two kinds of test:
//
//   - Ctrl-C on long work: the command is built, run with stderr on a
//     pipe (not a terminal), shows its progress in lines, and stops at
//     SIGINT or SIGTERM with one line and the status 128 + the signal's
//     number, by itself rather than killed by the signal.
//   - The interrupted write: SIGINT or SIGTERM while convert -o writes its
//     temporary file removes it. The test runs the command as a process
//     of its own (this test binary, which runs main when
//     GPUMEM_TEST_MAIN is set), reading from a named pipe that the test
//     holds open, so that the signal arrives while the temporary file
//     exists.

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

func TestMain(m *testing.M) {
	if os.Getenv("GPUMEM_TEST_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

func TestInterruptRemovesTemporaryFile(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			in := filepath.Join(dir, "in.trace")
			require.NoError(t, syscall.Mkfifo(in, 0o600))
			out := filepath.Join(dir, "out.trace")
			cmd := exec.Command(os.Args[0], "convert", "-o", out, in)
			cmd.Env = append(os.Environ(), "GPUMEM_TEST_MAIN=1")
			var stderr strings.Builder
			cmd.Stderr = &stderr
			require.NoError(t, cmd.Start())
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			w, err := os.OpenFile(in, os.O_WRONLY, 0) // waits for the command to open the pipe
			require.NoError(t, err)
			defer w.Close()
			_, err = w.WriteString("a 1 1024\n")
			require.NoError(t, err)

			// The command now waits for more input, its temporary file
			// created beside the output.
			deadline := time.Now().Add(20 * time.Second)
			for {
				entries, err := os.ReadDir(dir)
				require.NoError(t, err)
				if len(entries) == 2 {
					require.True(t, strings.HasPrefix(entries[0].Name(), ".out.trace.tmp-"), entries[0].Name())
					break
				}
				require.True(t, time.Now().Before(deadline), "no temporary file appeared: %s", stderr.String())
				time.Sleep(10 * time.Millisecond)
			}
			require.NoError(t, cmd.Process.Signal(sig))
			select {
			case err = <-done:
			case <-time.After(20 * time.Second):
				cmd.Process.Kill()
				t.Fatal("the command did not stop")
			}
			ws := waitStatus(t, err)
			// The command either stops by itself, in one line with the
			// status 128 + the signal's number, or, blocked on the pipe
			// past the grace, is ended by the signal.
			if ws.Signaled() {
				assert.Equal(t, sig, ws.Signal())
			} else {
				assert.Equal(t, 128+int(sig), ws.ExitStatus(), "ended by %v: %v", sig, ws)
				assert.Regexp(t, `^gpumem convert: interrupted by SIG(INT|TERM)\n$`, stderr.String())
			}
			assertOnly(t, dir, "in.trace")
		})
	}
}

// waitStatus returns the wait status of a command that ended with a
// non-zero status or by a signal, as Wait's error gives it.
func waitStatus(t *testing.T, err error) syscall.WaitStatus {
	t.Helper()
	var ee *exec.ExitError
	require.True(t, errors.As(err, &ee), "%v", err)
	ws, ok := ee.Sys().(syscall.WaitStatus)
	require.True(t, ok)
	return ws
}

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
	// A minute's grace: the command must stop by itself, however slowly a
	// loaded machine runs it (the 2 s of a plain build ended it first on
	// one).
	out, err := exec.Command("go", "build", "-ldflags", "-X main.interruptGraceSetting=1m", "-o", bin, ".").CombinedOutput()
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
			ws := waitStatus(t, err)
			assert.False(t, ws.Signaled(), "the command stops by itself, not killed by the signal")
			assert.Equal(t, 128+int(c.sig), ws.ExitStatus())
			// Stopping by itself (not killed by the signal) is stopping
			// within the grace the build set, a minute: the command ends
			// itself by the signal past it. That is liveness, not speed:
			// how long it took is logged, not asserted.
			t.Logf("stopped %v after the signal", stopped)
			sigName := map[syscall.Signal]string{syscall.SIGINT: "SIGINT", syscall.SIGTERM: "SIGTERM"}[c.sig]
			assert.Equal(t, []string{name + "interrupted by " + sigName}, rest, "one line")
		})
	}
}
