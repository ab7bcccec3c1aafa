// This file holds the searches: the largest batch and sequence that
// fit.

package estimate

import (
	"context"
	"fmt"
)

// Fits simulates the plan on its card and reports whether every
// allocation succeeded.
func (pl Plan) Fits() (bool, error) {
	if err := pl.Normalize(); err != nil {
		return false, err
	}
	return pl.fits(), nil
}

// fits simulates a normalized plan; a plan that cannot be simulated does
// not fit.
func (pl *Plan) fits() bool {
	ctx := pl.context()
	if ctx >= pl.Capacity {
		return false
	}
	s, _, err := simulate(pl, pl.Capacity-ctx)
	return err == nil && !s.OOM
}

// MaxBatch returns the largest batch, up to limit, with which the plan
// fits its card (0 if not even one sequence fits). A batch too large to
// represent simply does not fit.
func (pl Plan) MaxBatch(limit int) (int, error) {
	return pl.MaxBatchContext(context.Background(), limit)
}

// MaxBatchContext is MaxBatch, stopped when ctx is done: it checks ctx
// before each simulation, and then returns an error that wraps ctx.Err().
func (pl Plan) MaxBatchContext(ctx context.Context, limit int) (int, error) {
	if err := pl.Normalize(); err != nil {
		return 0, err
	}
	if pl.Model == nil {
		return 0, errNeedsDims
	}
	return largest(ctx, min(limit, MaxBatch), func(n int) bool {
		q := pl
		q.Workload.Batch = n
		return q.Normalize() == nil && q.fits()
	})
}

// MaxSeq returns the longest sequence (the context, in inference), up to
// limit and the model's learned positions, with which the plan fits.
func (pl Plan) MaxSeq(limit int) (int, error) {
	return pl.MaxSeqContext(context.Background(), limit)
}

// MaxSeqContext is MaxSeq, stopped when ctx is done: it checks ctx before
// each simulation, and then returns an error that wraps ctx.Err().
func (pl Plan) MaxSeqContext(ctx context.Context, limit int) (int, error) {
	if err := pl.Normalize(); err != nil {
		return 0, err
	}
	if pl.Model == nil {
		return 0, errNeedsDims
	}
	limit = min(limit, MaxSequence)
	if pl.Model.Family != Llama {
		limit = min(limit, pl.Model.MaxPositions-pl.Workload.Generate)
	}
	return largest(ctx, limit, func(n int) bool {
		q := pl
		q.Workload.Seq = n
		return q.Normalize() == nil && q.fits()
	})
}

var errNeedsDims = fmt.Errorf("the search needs the model's dimensions, not a bare parameter count")

// largest returns the largest n in 1..limit for which fits holds, assuming
// that it holds up to some n and not beyond (0 if not even for 1): it
// doubles, then bisects. It checks ctx before each call of fits.
func largest(ctx context.Context, limit int, fits func(int) bool) (int, error) {
	var stopped error
	try := func(n int) bool {
		if stopped = ctx.Err(); stopped != nil {
			return false
		}
		return fits(n)
	}
	done := func(n int) (int, error) {
		if stopped != nil {
			return 0, fmt.Errorf("search stopped: %w", stopped)
		}
		return n, nil
	}
	if limit < 1 || !try(1) {
		return done(0)
	}
	lo, hi := 1, 0 // fits(lo); !fits(hi) once hi > 0
	for hi == 0 {
		n := min(lo*2, limit)
		if n == lo {
			return done(lo)
		}
		if try(n) {
			lo = n
		} else {
			hi = n
		}
		if stopped != nil {
			return done(0)
		}
	}
	for hi-lo > 1 && stopped == nil {
		mid := lo + (hi-lo)/2
		if try(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return done(lo)
}
