// Package expvarstats publishes an allocator's statistics through the
// standard library's expvar package, under /debug/vars.
//
// It is a package of its own because expvar registers itself on import:
// importing expvar adds the /debug/vars handler to http.DefaultServeMux and
// publishes "cmdline" and "memstats". gpumem's core packages register
// nothing, so a program opts in by importing this package and calling
// Publish for each allocator it wants to show.
//
//	a, _ := allocator.New(dev, allocator.Config{})
//	if err := expvarstats.Publish("gpu0", a); err != nil { ... }
//	// GET /debug/vars now includes "gpu0": {"active.all.allocated": ..., ...}
package expvarstats

import (
	"errors"
	"expvar"
	"fmt"
	"sync"

	"github.com/gpumem/gpumem/stats"
)

// Source is anything that hands out a snapshot of its stats, such as an
// allocator. Stats must be safe to call from another goroutine at any time.
type Source interface {
	Stats() stats.DeviceStats
}

// publishMu serializes Publish, so that its check for a taken name and the
// registration cannot be split by another Publish.
var publishMu sync.Mutex

// Publish registers src with the expvar package under name. Each read of the
// variable (each request to /debug/vars, or expvar.Get(name).String())
// calls src.Stats() and shows its Map as a JSON object, keys sorted.
//
// expvar itself panics on a name that is already taken; Publish returns an
// error instead and registers nothing. Registrations are global and
// permanent (expvar has no way to remove one), so a library should leave
// the call to the application, which knows its allocators and their names.
func Publish(name string, src Source) (err error) {
	if name == "" {
		return errors.New("expvarstats: Publish needs a non-empty name")
	}
	if src == nil {
		return fmt.Errorf("expvarstats: Publish %q: nil Source", name)
	}
	publishMu.Lock()
	defer publishMu.Unlock()
	if expvar.Get(name) != nil {
		return fmt.Errorf("expvarstats: expvar name %q is already published", name)
	}
	// Code outside this package may have called expvar.Publish with the
	// same name since the check above; turn its panic into the same error.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("expvarstats: expvar name %q is already published", name)
		}
	}()
	expvar.Publish(name, expvar.Func(func() any { return src.Stats().Map() }))
	return nil
}
