// This file holds the pprof profile of live device memory by Go call site.

package record

import (
	"io"
	"runtime"
	"time"

	"github.com/google/pprof/profile"
)

// WriteProfile writes a pprof profile of the device memory that is live
// now, by the Go call stack that allocated it: two sample values per
// stack, the number of live blocks and their bytes (as requested by the
// callers). Open it with `go tool pprof`, for example
// `go tool pprof -top -sample_index=bytes FILE`. It needs a Recorder made
// with Options.Stacks; without it the profile is empty.
func (r *Recorder) WriteProfile(w io.Writer) error {
	live := r.LiveBlocks()
	p := &profile.Profile{
		SampleType: []*profile.ValueType{
			{Type: "blocks", Unit: "count"},
			{Type: "bytes", Unit: "bytes"},
		},
		DefaultSampleType: "bytes",
		PeriodType:        &profile.ValueType{Type: "device_memory", Unit: "bytes"},
		Period:            1,
		TimeNanos:         time.Now().UnixNano(),
	}
	locs := map[uintptr]*profile.Location{}
	funcs := map[string]*profile.Function{}
	// Samples with the same stack are added together.
	samples := map[string]*profile.Sample{}
	for _, b := range live {
		key := string(stackKey(b.Stack))
		if s, ok := samples[key]; ok {
			s.Value[0]++
			s.Value[1] += int64(b.Size)
			continue
		}
		s := &profile.Sample{Value: []int64{1, int64(b.Size)}}
		for _, pc := range b.Stack {
			loc, ok := locs[pc]
			if !ok {
				loc = &profile.Location{ID: uint64(len(locs) + 1), Address: uint64(pc)}
				frames := runtime.CallersFrames([]uintptr{pc})
				for {
					fr, more := frames.Next()
					fn, ok := funcs[fr.Function]
					if !ok {
						fn = &profile.Function{ID: uint64(len(funcs) + 1), Name: fr.Function, SystemName: fr.Function, Filename: fr.File}
						funcs[fr.Function] = fn
						p.Function = append(p.Function, fn)
					}
					loc.Line = append(loc.Line, profile.Line{Function: fn, Line: int64(fr.Line)})
					if !more {
						break
					}
				}
				locs[pc] = loc
				p.Location = append(p.Location, loc)
			}
			s.Location = append(s.Location, loc)
		}
		samples[key] = s
		p.Sample = append(p.Sample, s)
	}
	if err := p.CheckValid(); err != nil {
		return err
	}
	return p.Write(w)
}

func stackKey(pcs []uintptr) []byte {
	b := make([]byte, 0, 8*len(pcs))
	for _, pc := range pcs {
		for i := range 8 {
			b = append(b, byte(pc>>(8*i)))
		}
	}
	return b
}
