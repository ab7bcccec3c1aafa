// Tests of Validator.

package trace

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func TestValidatorRules(t *testing.T) {
	v := NewValidator()
	check := func(line string, n int) (bool, error) {
		op, err := ParseOp(line)
		require.NoError(t, err)
		return v.Check(op, n)
	}
	skip, err := check("a 1 10 0", 1)
	require.NoError(t, err)
	assert.False(t, skip)
	_, err = check("r 1 2", 2)
	require.NoError(t, err)

	_, err = check("a 1 20 0", 3)
	var se *StateError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, 3, se.Line)
	assert.EqualError(t, err, `memtrace line 3: "a 1 20 0": ID 1 is already live`)

	_, err = check("f 2", 4)
	assert.EqualError(t, err, `memtrace line 4: "f 2": ID 2 is not live`)
	_, err = check("r 2 1", 5)
	assert.EqualError(t, err, `memtrace line 5: "r 2 1": ID 2 is not live`)

	_, err = check("f 1", 6)
	require.NoError(t, err)
	_, err = check("f 1", 7)
	assert.Error(t, err, "double free")
	_, err = check("a 1 5 0", 8)
	assert.NoError(t, err, "an ID may be reused after its free")
	assert.Equal(t, 1, v.Live())

	// Ops that need no state pass.
	for _, l := range []string{"s 3", "S", "c", "t x", "t", "m step1", "# mark step2"} {
		_, err = check(l, 9)
		assert.NoError(t, err, l)
	}
	// An op Check refuses is a StateError too.
	_, err = v.Check(Op{Kind: 'z'}, 10)
	require.ErrorAs(t, err, &se)
	assert.Equal(t, 10, se.Line)
}

func TestValidatorFailedAllocations(t *testing.T) {
	v := NewValidator()
	_, err := v.Check(Op{Kind: Alloc, ID: 5, Size: 1 << 40}, 1)
	require.NoError(t, err)
	require.NoError(t, v.MarkFailed(5))
	assert.Error(t, v.MarkFailed(5), "already marked")
	assert.Error(t, v.MarkFailed(6), "not live")

	_, err = v.Check(Op{Kind: Alloc, ID: 5, Size: 1}, 2)
	require.Error(t, err)
	assert.True(t, strings.Contains(err.Error(), "allocation failed"), err.Error())

	skip, err := v.Check(Op{Kind: RecordStream, ID: 5, Stream: 1}, 3)
	require.NoError(t, err)
	assert.True(t, skip)
	skip, err = v.Check(Op{Kind: Free, ID: 5}, 4)
	require.NoError(t, err)
	assert.True(t, skip)
	assert.Zero(t, v.Live())
	_, err = v.Check(Op{Kind: Free, ID: 5}, 5)
	assert.Error(t, err, "the skipped free still ends the ID")
}

func TestValidatorLiveIDs(t *testing.T) {
	v := NewValidator()
	for _, id := range []uint64{9, 1 << 40, 2, 7} {
		_, err := v.Check(Op{Kind: Alloc, ID: id}, 0)
		require.NoError(t, err)
	}
	assert.Equal(t, []uint64{2, 7, 9, 1 << 40}, v.LiveIDs())
	_, err := v.Check(Op{Kind: Free, ID: 3}, 0)
	assert.EqualError(t, err, `memtrace: "f 3": ID 3 is not live`)
}

// TestIDSetMatchesMap drives idSet and a Go map with the same random
// operations, with IDs drawn so that probe runs collide and wrap, and on
// both sides of maxDenseID (the dense table and the hash table), and
// requires identical answers, and the same live IDs at the end.
func TestIDSetMatchesMap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var s idSet
		ref := map[uint64]bool{}
		id := rapid.Custom(func(t *rapid.T) uint64 {
			if rapid.Bool().Draw(t, "wide") {
				return rapid.Uint64().Draw(t, "any")
			}
			if rapid.Bool().Draw(t, "dense") {
				return rapid.Uint64Range(0, 200).Draw(t, "small")
			}
			return rapid.Uint64Range(maxDenseID-100, maxDenseID+100).Draw(t, "edge")
		})
		// same fails unless an answer (marked, ok) about x is the map's.
		same := func(op string, x uint64, marked, ok bool) {
			want, had := ref[x]
			if ok != had || marked != want {
				t.Fatalf("%s(%d) = %v %v, want %v %v", op, x, marked, ok, want, had)
			}
		}
		for range rapid.IntRange(0, 500).Draw(t, "ops") {
			x := id.Draw(t, "id")
			switch rapid.IntRange(0, 3).Draw(t, "op") {
			case 0:
				_, had := ref[x]
				if got := s.add(x); got == had {
					t.Fatalf("add(%d) = %v, present %v", x, got, had)
				}
				if !had {
					ref[x] = false
				}
			case 1:
				marked, ok := s.remove(x)
				same("remove", x, marked, ok)
				delete(ref, x)
			case 2:
				if _, had := ref[x]; had {
					s.mark(x)
					ref[x] = true
				}
			case 3:
				marked, ok := s.get(x)
				same("get", x, marked, ok)
			}
			if s.n != len(ref) {
				t.Fatalf("n %d, want %d", s.n, len(ref))
			}
		}
		want := slices.Sorted(maps.Keys(ref))
		if got := (&Validator{live: s}).LiveIDs(); !slices.Equal(got, want) && len(got)+len(want) > 0 {
			t.Fatalf("live IDs %v, want %v", got, want)
		}
	})
}
