// This file holds what guards the command's output and messages: the
// checked standard output, files replaced only when complete, and error
// messages of one line that quote a bounded part of any input.

package main

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	inputquote "github.com/gpumem/gpumem/internal/quote"
)

// checkedWriter passes writes on and keeps the first error; after one,
// it writes nothing more.
type checkedWriter struct {
	w   io.Writer
	err error
}

func (c *checkedWriter) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.w.Write(p)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	c.err = err
	return n, err
}

// maxQuote is how many bytes of any input a message quotes.
const maxQuote = inputquote.Max

// maxMessage bounds a whole error message, whatever it holds.
const maxMessage = 1200

// clip returns s, or its first maxQuote bytes (whole characters) and a
// note of its length.
func clip(s string) string {
	if len(s) <= maxQuote {
		return s
	}
	n := maxQuote
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return fmt.Sprintf("%s... (%d bytes)", s[:n], len(s))
}

// quote returns s quoted in Go syntax, at most maxQuote bytes of it: the
// rule of the library's configuration parsers (internal/quote).
func quote(s string) string { return inputquote.Quote(s) }

// oneLine makes msg fit one line of bounded length: line breaks become
// "; ", each quoted string longer than maxQuote bytes is cut, and what is
// still longer than maxMessage is cut in the middle.
func oneLine(msg string) string {
	var b strings.Builder
	for i := 0; i < len(msg); {
		c := msg[i]
		switch c {
		case '"':
			if q, err := strconv.QuotedPrefix(msg[i:]); err == nil {
				if s, err := strconv.Unquote(q); err == nil {
					b.WriteString(quote(s)) // requoted: no raw control character survives
				} else {
					b.WriteString(strings.NewReplacer("\r", `\r`, "\n", `\n`).Replace(q))
				}
				i += len(q)
				continue
			}
		case '\r':
			i++
			continue
		case '\n':
			b.WriteString("; ")
			i++
			continue
		}
		b.WriteByte(c)
		i++
	}
	s := b.String()
	if len(s) > maxMessage {
		head, tail := s[:maxMessage/2], s[len(s)-maxMessage/4:]
		s = strings.ToValidUTF8(head, "") + fmt.Sprintf(" [... %d bytes ...] ", len(s)-len(head)-len(tail)) + strings.ToValidUTF8(tail, "")
	}
	return s
}

// fileError rewrites an error of the file system so that it quotes the
// path within bounds.
func fileError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s %s: %w", pe.Op, quote(pe.Path), pe.Err)
	}
	return err
}

// writeOutput writes what write produces to the file at path, so that it
// is never left half-written: the output goes to a new file beside the
// target, which replaces the target only once everything was written,
// flushed and closed; on any failure the target is left as it was. A path
// that is a symbolic link is followed, and the file it leads to is
// replaced; the link stays. "-" is standard output, and a path that is not
// a regular file (a device, a pipe, a terminal) is written directly.
func writeOutput(path string, stdout io.Writer, write func(w io.Writer) error) error {
	if path == "-" {
		return write(stdout)
	}
	if path == "" {
		return errors.New("writing: no file name given")
	}
	name := clip(path)
	info, err := os.Stat(path)
	switch {
	case err == nil && info.IsDir():
		return fmt.Errorf("writing %s: it is a directory", name)
	case err == nil && !info.Mode().IsRegular():
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return fmt.Errorf("writing %s: %w", name, fileError(err))
		}
		if err := writeClose(f, write); err != nil {
			return fmt.Errorf("writing %s: %w", name, err)
		}
		return nil
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("writing %s: %w", name, fileError(err))
	}
	target, err := resolveLinks(path)
	if err != nil {
		return fmt.Errorf("writing %s: %w", name, fileError(err))
	}
	tmp, f, err := createBeside(target)
	if err != nil {
		return fmt.Errorf("writing %s: creating a file beside it: %w", name, fileError(err))
	}
	if !temps.add(tmp) {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("writing %s: interrupted", name)
	}
	defer temps.remove(tmp)
	if info != nil {
		// Keep the mode of the file replaced.
		if err := f.Chmod(info.Mode().Perm()); err != nil {
			f.Close()
			os.Remove(tmp)
			return fmt.Errorf("writing %s: %w", name, fileError(err))
		}
	}
	err = writeClose(f, write)
	if err == nil {
		err = temps.rename(tmp, target)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", name, fileError(err))
	}
	return nil
}

// writeClose runs write on a buffered, checked writer over f, then
// flushes, syncs a regular file to disk and closes f, returning the first
// error.
func writeClose(f *os.File, write func(w io.Writer) error) error {
	cw := &checkedWriter{w: f}
	bw := bufio.NewWriterSize(cw, 64<<10)
	err := write(bw)
	if err == nil {
		err = bw.Flush()
	}
	if err == nil && cw.err != nil {
		err = cw.err
	}
	if err == nil {
		if info, serr := f.Stat(); serr == nil && info.Mode().IsRegular() {
			err = f.Sync()
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fileError(err)
	}
	return nil
}

// createBeside creates a new file in target's directory, named after it,
// with the mode a new file gets (0666 less the umask).
func createBeside(target string) (string, *os.File, error) {
	dir, base := filepath.Split(target)
	if len(base) > 100 {
		base = base[:100]
	}
	for range 100 {
		var r [6]byte
		if _, err := rand.Read(r[:]); err != nil {
			return "", nil, err
		}
		tmp := filepath.Join(dir, "."+base+".tmp-"+hex.EncodeToString(r[:]))
		f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o666)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		return tmp, f, err
	}
	return "", nil, errors.New("no free temporary name")
}

// resolveLinks follows path through symbolic links to the file they lead
// to, which need not exist (a dangling link names the file to create).
func resolveLinks(path string) (string, error) {
	for range 40 {
		info, err := os.Lstat(path)
		if errors.Is(err, fs.ErrNotExist) {
			return path, nil
		}
		if err != nil {
			return "", err
		}
		if info.Mode()&fs.ModeSymlink == 0 {
			return path, nil
		}
		link, err := os.Readlink(path)
		if err != nil {
			return "", err
		}
		if !filepath.IsAbs(link) {
			link = filepath.Join(filepath.Dir(path), link)
		}
		path = link
	}
	return "", fmt.Errorf("too many levels of symbolic links")
}

// temps are the temporary files that writeOutput is writing, removed by
// removeTemps when a signal stops the command, so that an interrupted
// write leaves nothing behind.
var temps tempFiles

type tempFiles struct {
	mu      sync.Mutex // guards everything below
	paths   map[string]bool
	stopped bool // removeTemps ran: no new file, no rename
}

// add records path; it returns false once removeTemps has run.
func (t *tempFiles) add(path string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return false
	}
	if t.paths == nil {
		t.paths = map[string]bool{}
	}
	t.paths[path] = true
	return true
}

func (t *tempFiles) remove(path string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.paths, path)
}

// rename moves the complete temporary file tmp to target, unless the
// command is being stopped.
func (t *tempFiles) rename(tmp, target string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return errors.New("interrupted")
	}
	return os.Rename(tmp, target)
}

// removeTemps removes every temporary file and refuses new ones; it holds
// the lock on return when hold is true, so that no rename can follow
// before the process ends.
func (t *tempFiles) removeTemps(hold bool) {
	t.mu.Lock()
	t.stopped = true
	for p := range t.paths {
		os.Remove(p)
	}
	clear(t.paths)
	if !hold {
		t.mu.Unlock()
	}
}

// sameFile returns an error when the output path out, if it is an
// existing regular file, is the same file as one of the inputs (the same
// device and inode, whatever links lead to either), so that a command
// never replaces the trace it reads. Run it before reading anything.
func sameFile(flag, out string, inputs ...string) error {
	if out == "" || out == "-" {
		return nil
	}
	oi, err := os.Stat(out)
	if err != nil || !oi.Mode().IsRegular() {
		return nil
	}
	for _, in := range inputs {
		if ii, err := os.Stat(in); err == nil && os.SameFile(oi, ii) {
			if in == out {
				return usageError{fmt.Sprintf("%s %s is the input: write the output to another file", flag, quote(out))}
			}
			return usageError{fmt.Sprintf("%s %s is the same file as the input %s: write the output to another file", flag, quote(out), quote(in))}
		}
	}
	return nil
}
