// This file holds the replay of pool lines (P, u, g, e, z, w, d): the
// Target interfaces they need and their application.

package replay

import (
	"errors"
	"fmt"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/trace"
)

// Pooler is a Target that keeps named pools, as *allocator.Allocator
// does: Run applies the pool lines (P, u, g, e, d) to it. On any other
// Target (the Passthrough baseline) a pool line stops the replay with an
// error that names the line. The z and w lines need a Pooler that is also
// a Pauser.
type Pooler interface {
	NewPool(name string, o allocator.PoolOptions) (*allocator.Pool, error)
	UsePool(p *allocator.Pool, s device.Stream) error
	UseDefaultPool(s device.Stream) error
	BeginCapture(p *allocator.Pool, s device.Stream) error
	EndCapture(s device.Stream) error
	ReleasePool(p *allocator.Pool) error
	PoolStats(p *allocator.Pool) (allocator.PoolStats, error)
}

// Pauser is a Pooler that can pause and resume its pools (the z and w
// lines).
type Pauser interface {
	PausePool(p *allocator.Pool, backup bool) error
	ResumePool(p *allocator.Pool) error
}

// applyPool applies a pool line to the Target, which must be a Pooler (and
// a Pauser for z and w).
func (rp *replayer) applyPool(op *trace.Op) error {
	if rp.pooler == nil {
		return errors.New("the replayed allocator keeps no pools: pool lines need the caching allocator, not the pass-through baseline or backend:cudaMallocAsync")
	}
	pool := func() (*allocator.Pool, error) {
		p := rp.pools[op.Name]
		if p == nil {
			return nil, fmt.Errorf("no pool named %s (make it with a P line; a d line drops it)", trace.Quote(op.Name))
		}
		return p, nil
	}
	switch op.Kind {
	case trace.MakePool:
		if rp.pools[op.Name] != nil {
			return fmt.Errorf("pool %s exists (drop it with a d line first)", trace.Quote(op.Name))
		}
		p, err := rp.pooler.NewPool(op.Name, allocator.PoolOptions{NoSplit: op.Flags&trace.NoSplit != 0, UseOnOOM: op.Flags&trace.UseOnOOM != 0})
		if err != nil {
			return err
		}
		if rp.pools == nil {
			rp.pools = make(map[string]*allocator.Pool)
		}
		rp.pools[op.Name] = p
		return nil
	case trace.EndCapture:
		s, err := rp.stream(op.Stream)
		if err != nil {
			return err
		}
		return rp.pooler.EndCapture(s)
	case trace.UsePool, trace.BeginCapture:
		s, err := rp.stream(op.Stream)
		if err != nil {
			return err
		}
		if op.Name == trace.DefaultPool {
			return rp.pooler.UseDefaultPool(s)
		}
		p, err := pool()
		if err != nil {
			return err
		}
		if op.Kind == trace.UsePool {
			return rp.pooler.UsePool(p, s)
		}
		return rp.pooler.BeginCapture(p, s)
	}
	p, err := pool()
	if err != nil {
		return err
	}
	if op.Kind == trace.DropPool {
		if err := rp.pooler.ReleasePool(p); err != nil {
			return err
		}
		delete(rp.pools, op.Name)
		delete(rp.paused, op.Name)
		return nil
	}
	ps, ok := rp.pooler.(Pauser)
	if !ok {
		return errors.New("the replayed allocator cannot pause and resume pools")
	}
	if op.Kind == trace.PausePool {
		err = ps.PausePool(p, false) // a trace carries no bytes to back up
	} else {
		err = ps.ResumePool(p)
	}
	if err == nil {
		if rp.paused == nil {
			rp.paused = make(map[string]bool)
		}
		rp.paused[op.Name] = op.Kind == trace.PausePool
	}
	return err
}
