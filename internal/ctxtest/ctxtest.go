// Package ctxtest gives gpumem's tests a context that is done at a known
// point of the work: the stand-in for a Ctrl-C in the middle of a search
// or a replay.
//
// # Model
//
// A Countdown answers Err with nil for its first n questions and with
// context.Canceled from then on; its Done channel is that of the parent
// (never closed for context.Background), so the code under test sees the
// end only through Err, the check gpumem's long loops make. Left reports
// how many questions remain: -1 after the first question that saw the
// context done, so a test can assert that the work stopped at once.
package ctxtest

import (
	"context"
	"sync/atomic"
)

// Countdown is a context that is done after its Err has been asked n
// times.
type Countdown struct {
	context.Context
	n atomic.Int64
}

// NewCountdown returns a Countdown over context.Background whose Err
// answers nil n times.
func NewCountdown(n int64) *Countdown {
	c := &Countdown{Context: context.Background()}
	c.n.Store(n)
	return c
}

// Err returns nil while questions remain, then context.Canceled.
func (c *Countdown) Err() error {
	if c.n.Add(-1) < 0 {
		return context.Canceled
	}
	return nil
}

// Reset gives the context n more questions before it is done.
func (c *Countdown) Reset(n int64) { c.n.Store(n) }

// Left returns the questions that remain: n minus the questions asked,
// so -1 once exactly one question has seen the context done.
func (c *Countdown) Left() int64 { return c.n.Load() }
