//go:build unix

package main

// The interrupted write: SIGINT or SIGTERM while convert -o writes its
// temporary file removes it. The test runs the command as a process of
// its own (this test binary, which runs main when GPUMEM_TEST_MAIN is
// set), reading from a named pipe that the test holds open, so that the
// signal arrives while the temporary file exists.

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
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
			var ee *exec.ExitError
			require.True(t, errors.As(err, &ee), "%v", err)
			ws, ok := ee.Sys().(syscall.WaitStatus)
			require.True(t, ok)
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
