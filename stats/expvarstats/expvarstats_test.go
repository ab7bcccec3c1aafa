// This file tests Publish: the expvar variable, its JSON under /debug/vars
// and the errors that replace expvar's panics.

package expvarstats

import (
	"encoding/json"
	"expvar"
	"fmt"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/gpumem/gpumem/stats"
	"github.com/stretchr/testify/require"
)

// liveSource is a Source whose stats change between reads, as an
// allocator's do.
type liveSource struct {
	mu sync.Mutex
	d  stats.DeviceStats
}

func (s *liveSource) Stats() stats.DeviceStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.d
}

func (s *liveSource) alloc(n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.d.Allocation.Increase(stats.LargePool, 1)
	s.d.AllocatedBytes.Increase(stats.LargePool, n)
}

func TestPublishExpvarGet(t *testing.T) {
	src := &liveSource{}
	require.NoError(t, Publish("gpumem_test_get", src))

	read := func() map[string]int64 {
		v := expvar.Get("gpumem_test_get")
		require.NotNil(t, v)
		var m map[string]int64
		require.NoError(t, json.Unmarshal([]byte(v.String()), &m))
		return m
	}
	m := read()
	assert.Len(t, m, stats.NumKeys)
	assert.Zero(t, m["allocated_bytes.all.current"])

	src.alloc(4096)
	m = read()
	assert.Equal(t, int64(4096), m["allocated_bytes.all.current"], "each read sees the current stats")
	assert.Equal(t, int64(1), m["allocation.large_pool.current"])
}

func TestPublishHandler(t *testing.T) {
	src := &liveSource{}
	src.alloc(1 << 20)
	require.NoError(t, Publish("gpumem_test_http", src))

	srv := httptest.NewServer(expvar.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/debug/vars")
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
	var vars map[string]json.RawMessage
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&vars))
	require.Contains(t, vars, "gpumem_test_http")
	require.Contains(t, vars, "memstats", "the handler serves every variable")
	var m map[string]int64
	require.NoError(t, json.Unmarshal(vars["gpumem_test_http"], &m))
	assert.Equal(t, src.Stats().Map(), m)
}

func TestPublishErrors(t *testing.T) {
	src := &liveSource{}
	require.NoError(t, Publish("gpumem_test_dup", src))

	err := Publish("gpumem_test_dup", &liveSource{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "already published")

	// A name that other code took through expvar directly.
	expvar.NewInt("gpumem_test_taken")
	require.Error(t, Publish("gpumem_test_taken", src))
	_, isInt := expvar.Get("gpumem_test_taken").(*expvar.Int)
	assert.True(t, isInt, "the existing variable is left alone")

	require.Error(t, Publish("", src))
	require.Error(t, Publish("gpumem_test_nil", nil))
	assert.Nil(t, expvar.Get("gpumem_test_nil"), "nothing published on error")
}

func TestPublishConcurrent(t *testing.T) {
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { errs[i] = Publish("gpumem_test_race", &liveSource{}) })
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		if err == nil {
			ok++
		}
	}
	assert.Equal(t, 1, ok, "exactly one Publish of a name wins: %v", fmt.Sprint(errs))
}
