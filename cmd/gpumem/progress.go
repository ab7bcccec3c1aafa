// This file holds the progress of long work: the bar drawn on a terminal
// during replays and tunes, and the lines written every few seconds
// where stderr is not a terminal.

package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/term"
)

// progressBar draws "name [#####.....] 42%" on one terminal line, at most
// ten times a second.
type progressBar struct {
	w     io.Writer
	name  string
	total int64
	done  *atomic.Int64 // how far, in the units of total
	last  time.Time
	drawn bool
}

// newProgressBar returns a bar of done out of total; done is a new
// counter if nil.
func newProgressBar(w io.Writer, name string, total int64, done *atomic.Int64) *progressBar {
	if done == nil {
		done = new(atomic.Int64)
	}
	return &progressBar{w: w, name: clip(filepath.Base(name)), total: total, done: done}
}

func (p *progressBar) draw(force bool) {
	now := time.Now()
	if !force && now.Sub(p.last) < 100*time.Millisecond {
		return
	}
	p.last = now
	frac := float64(p.done.Load()) / float64(p.total)
	frac = min(max(frac, 0), 1)
	const width = 30
	n := int(frac * width)
	fmt.Fprintf(p.w, "\r%s [%s%s] %3.0f%%", p.name, strings.Repeat("#", n), strings.Repeat(".", width-n), frac*100)
	p.drawn = true
}

// finish clears the bar's line.
func (p *progressBar) finish() {
	if p.drawn {
		fmt.Fprintf(p.w, "\r%s\r", strings.Repeat(" ", len(p.name)+40))
	}
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n.Add(int64(n))
	return n, err
}

// progressEvery is how often long work writes a progress line where
// stderr is not a terminal.
var progressEvery = 3 * time.Second

// lineOutput returns where to write progress lines: stderr when it is a
// file that is not a terminal (a pipe, a log file), else nil (a terminal
// gets the bar; a writer that is not a file, nothing).
func lineOutput(stderr io.Writer) io.Writer {
	if f, ok := stderr.(*os.File); ok && !term.IsTerminal(int(f.Fd())) {
		return stderr
	}
	return nil
}

// startProgress writes "NAME: STATUS (ELAPSED)" on w every progressEvery
// until stop is called; stop returns once no line can follow. With w nil
// it writes nothing. status is called from another goroutine: it reads
// atomics.
func startProgress(w io.Writer, name string, status func() string) (stop func()) {
	if w == nil {
		return func() {}
	}
	start := time.Now()
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(progressEvery)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case now := <-t.C:
				fmt.Fprintf(w, "%s: %s (%v)\n", name, status(), now.Sub(start).Round(time.Second))
			}
		}
	}()
	return func() {
		close(quit)
		<-done
	}
}

// progress is where a command shows its progress: bar on a terminal,
// lines elsewhere (either may be nil).
type progress struct {
	bar, lines io.Writer
}

// progressTo returns where to show progress on stderr; quiet turns the
// bar off (a line every few seconds on a pipe or a log does no harm).
func progressTo(stderr io.Writer, quiet bool) progress {
	return progress{bar: progressOutput(stderr, quiet), lines: lineOutput(stderr)}
}
