// This file holds the progress bar drawn on a terminal during long
// replays and tunes.

package main

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"
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
