package record

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/google/pprof/profile"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gpumem/gpumem/allocator"
	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/gpumemtest"
	"github.com/gpumem/gpumem/trace"
)

//go:noinline
func allocateWeights(t *testing.T, a *allocator.Allocator, n int) []device.Ptr {
	var ps []device.Ptr
	for range n {
		p, err := a.Alloc(4<<20, 0)
		require.NoError(t, err)
		ps = append(ps, p)
	}
	return ps
}

//go:noinline
func allocateActivations(t *testing.T, a *allocator.Allocator) device.Ptr {
	p, err := a.Alloc(1<<20, 0)
	require.NoError(t, err)
	return p
}

func TestWriteProfileByCallSite(t *testing.T) {
	a := gpumemtest.New(t, gpumemtest.AllowLeaks())
	rec := New(trace.NewWriter(io.Discard), Options{Stacks: true})
	defer a.Attach(rec)()

	allocateWeights(t, a, 3)
	act := allocateActivations(t, a)
	freed := allocateActivations(t, a)
	require.NoError(t, a.Free(freed))

	var buf bytes.Buffer
	require.NoError(t, rec.WriteProfile(&buf))
	p, err := profile.Parse(&buf)
	require.NoError(t, err)
	require.NoError(t, p.CheckValid())

	bySite := map[string][2]int64{}
	for _, s := range p.Sample {
		for _, loc := range s.Location {
			for _, l := range loc.Line {
				for _, site := range []string{"allocateWeights", "allocateActivations"} {
					if strings.HasSuffix(l.Function.Name, "."+site) {
						v := bySite[site]
						bySite[site] = [2]int64{v[0] + s.Value[0], v[1] + s.Value[1]}
					}
				}
			}
		}
	}
	assert.Equal(t, [2]int64{3, 12 << 20}, bySite["allocateWeights"])
	assert.Equal(t, [2]int64{1, 1 << 20}, bySite["allocateActivations"], "the freed block is not live")
	_ = act
}
