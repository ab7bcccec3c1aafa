package freeindex

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gpumem/gpumem/device"
	"github.com/gpumem/gpumem/stats"
)

// testIndex is a free index of one kind with its pool, driven as the
// allocator drives it: segments filed whole, blocks handed out from the
// best fit and freed back.
type testIndex struct {
	x    Index
	p    *Pool
	next device.Ptr
}

func newTestIndex(k Kind) *testIndex {
	ti := &testIndex{p: &Pool{idx: 1, stat: stats.LargePool}, next: 1 << 40}
	if k == KindSmall {
		ti.p = &Pool{small: true, idx: 0, stat: stats.SmallPool}
	}
	ti.x.Init(0, new(Spares), 0, ti.p, k)
	return ti
}

// segment files a new plain segment of size bytes, free, and returns its
// block.
func (ti *testIndex) segment(size uint64) *Block {
	seg := &Segment{ptr: ti.next, size: size, pool: ti.p, free: &ti.x}
	ti.next += device.Ptr(size)
	b := onSeg(&Block{ptr: seg.ptr, size: size, pool: ti.p}, seg)
	seg.head = b
	ti.x.SegmentAdded()
	ti.x.Put(b)
	return b
}

// alloc hands out size bytes from the best fit, from a new segment of
// segSize bytes when none fits, split as the allocator splits a small
// block (a rest of 512 bytes or more).
func (ti *testIndex) alloc(size, segSize uint64) *Block {
	b := ti.x.BestFit(size)
	if b == nil {
		ti.segment(segSize)
		b = ti.x.BestFit(size)
	}
	f := ti.x.Take(b, size, b.size-size >= MinBlockSize)
	f.Allocated = true
	return f
}

// free returns a block handed out by alloc.
func (ti *testIndex) free(b *Block) {
	b.Allocated = false
	ti.x.Put(b)
}

// check returns the faults the index's check reports, one a line.
func (ti *testIndex) check() string {
	var faults []string
	ti.x.Check(func(format string, args ...any) {
		faults = append(faults, fmt.Sprintf(format, args...))
	})
	return strings.Join(faults, "\n")
}

// fourFreeSmallBlocks makes four free 512-byte blocks (a size bucket with
// a heap) in an index of size buckets.
func fourFreeSmallBlocks() *testIndex {
	ti := newTestIndex(KindSmall)
	var bs []*Block
	for range 8 {
		bs = append(bs, ti.alloc(512, SmallBuffer))
	}
	for i := 0; i < len(bs); i += 2 {
		ti.free(bs[i])
	}
	return ti
}

// TestIndexCheckCatchesCorruption breaks a free index's structures in
// each way its check promises to notice, and requires it to notice.
func TestIndexCheckCatchesCorruption(t *testing.T) {
	for _, c := range []struct {
		name, want string
		breakIt    func() *testIndex
	}{
		{"a pending split whose front is not its front", "whose split is pending", func() *testIndex {
			ti := newTestIndex(KindSmall)
			ti.alloc(4096, SmallBuffer) // a small segment: [4 KiB][rest free]
			ti.alloc(4096, SmallBuffer) // splits the free rest: its move waits
			if ti.x.pend == nil {
				panic("no pending split")
			}
			ti.x.pendKey.ptr += 512
			return ti
		}},
		{"a pending split whose front has a free lower neighbour", "free lower neighbour", func() *testIndex {
			ti := newTestIndex(KindSmall)
			a := ti.alloc(4096, SmallBuffer)
			ti.alloc(4096, SmallBuffer) // its front's lower neighbour is a
			a.Allocated = false         // freed without a Put, which would settle the split
			return ti
		}},
		{"a whole free segment missing from its list", "fills its segment", func() *testIndex {
			ti := newTestIndex(KindLarge)
			ti.segment(20 * mib)
			ti.x.wholes = nil
			return ti
		}},
		{"a listed whole segment taken out of the index behind its back", "blocks not in the index", func() *testIndex {
			ti := newTestIndex(KindLarge)
			ti.segment(20 * mib)
			ti.x.large.remove(ti.x.wholes)
			return ti
		}},
		{"a free index whose structures are not its kind's", "structures of another kind", func() *testIndex {
			ti := newTestIndex(KindSmall)
			ti.x.large = new(largeBuckets)
			return ti
		}},
		{"tree out of order", "out of order", func() *testIndex {
			ti := newTestIndex(KindLarge) // free blocks above 128 MiB are in the tree
			ti.segment(200 * mib)
			ti.segment(300 * mib)
			l := ti.x.tree.leaf
			l.keys[0], l.keys[1] = l.keys[1], l.keys[0]
			l.vals[0], l.vals[1] = l.vals[1], l.vals[0]
			return ti
		}},
		{"a tree's block whose size changed under it", "does not match its block", func() *testIndex {
			ti := newTestIndex(KindLarge)
			ti.segment(200 * mib)
			ti.x.tree.leaf.vals[0].size -= 512
			return ti
		}},
		{"a large bucket's block whose size changed under it", "of another size", func() *testIndex {
			ti := newTestIndex(KindLarge)
			ti.alloc(3*mib, 20*mib) // [3 MiB allocated][17 MiB free]
			ti.x.Flush()
			ti.x.Fit(17 * mib).size -= 512
			return ti
		}},
		{"a large bucket's bit cleared", "has no bit", func() *testIndex {
			ti := newTestIndex(KindLarge)
			ti.segment(20 * mib)
			clear(ti.x.large.l0[:])
			return ti
		}},
		{"a large class above the bound of the classes", "above the bound", func() *testIndex {
			ti := newTestIndex(KindLarge)
			ti.segment(20 * mib)
			ti.x.large.top = classOf(20*mib) - 1 // a fit for 20 MiB would miss the block
			return ti
		}},
		{"a large bitmap's second level wrong", "second-level bit", func() *testIndex {
			ti := newTestIndex(KindLarge)
			ti.segment(20 * mib)
			ti.x.large.l1[3] |= 1
			return ti
		}},
		{"a large bucket moved in its table", "where a lookup finds it", func() *testIndex {
			ti := newTestIndex(KindLarge)
			ti.segment(20 * mib)
			lb := ti.x.large
			for i := range lb.tab {
				if lb.tab[i].class != 0 {
					j := (i + len(lb.tab)/2) % len(lb.tab)
					lb.tab[i], lb.tab[j] = lb.tab[j], lb.tab[i]
					break
				}
			}
			return ti
		}},
		{"a paged class moved in its page", "not at its place", func() *testIndex {
			ti := newTestIndex(KindLarge)
			ti.x.KeepPages()
			ti.segment(20 * mib)
			c := classOf(20 * mib)
			p := ti.x.large.pages[c>>6]
			p[c&63], p[(c+1)&63] = p[(c+1)&63], p[c&63]
			return ti
		}},
		{"a paged class in the table", "classes in its table", func() *testIndex {
			ti := newTestIndex(KindLarge)
			ti.x.KeepPages()
			ti.segment(20 * mib)
			lb, c := ti.x.large, classOf(20*mib)
			lb.tab = make([]bucket, 16)
			lb.shift = tableShift(16)
			lb.tab[lb.home(int32(c)+1)] = bucket{class: int32(c) + 1, first: ti.x.wholes}
			lb.used = 1
			return ti
		}},
		{"a paged word without its page", "page of classes is missing", func() *testIndex {
			ti := newTestIndex(KindLarge)
			ti.x.KeepPages()
			ti.segment(20 * mib)
			ti.x.large.pages[classOf(20*mib)>>6] = nil
			return ti
		}},
		{"a large word's page kept when it emptied", "page is kept empty", func() *testIndex {
			ti := newTestIndex(KindLarge)
			ti.x.KeepPages()
			ti.segment(20 * mib)
			ti.x.large.pages[classOf(30*mib)>>6] = new(classPage) // zero, of a word with no class
			return ti
		}},
		{"a class left in the kept page of an empty word", "empty word is not zero", func() *testIndex {
			ti := newTestIndex(KindLarge)
			ti.x.KeepPages()
			ti.segment(20 * mib)
			c := classOf(4096) // a word of small classes, which keeps its page
			p := new(classPage)
			p[c&63] = bucket{class: int32(c) + 1, first: ti.x.wholes}
			ti.x.large.pages[c>>6] = p // with no bit for it
			return ti
		}},
		{"a word of small classes counted in the sums", "count of blocks is wrong", func() *testIndex {
			ti := newTestIndex(KindLarge)
			ti.segment(20 * mib)
			ti.x.large.summarize()
			ti.x.large.sums[classOf(4096)>>6].cnt = 1 // the close fit reads no such word: it stays zero
			return ti
		}},
		{"word sums that count no class", "first class the word sums count", func() *testIndex {
			ti := newTestIndex(KindLarge)
			ti.segment(20 * mib)
			ti.x.large.summarize()
			ti.x.large.sumsAt = largeClasses
			return ti
		}},
		{"a large bucket out of heap order", "not a heap by address", func() *testIndex {
			ti := newTestIndex(KindLarge)
			var bs []*Block
			for range 8 { // 3 MiB blocks: a 20 MiB segment holds six
				bs = append(bs, ti.alloc(3*mib, 20*mib))
			}
			for i := 1; i < len(bs); i += 2 {
				ti.free(bs[i])
			}
			ti.x.Flush()
			bk := ti.x.large.find(classOf(3 * mib))
			h := bk.heap
			h[0], h[1] = h[1], h[0]
			h[0].heapIdx, h[1].heapIdx = 0, 1
			bk.first = h[0]
			return ti
		}},
		{"a size bucket's bit cleared", "size-class bit", func() *testIndex {
			ti := newTestIndex(KindSmall)
			ti.alloc(4096, SmallBuffer) // a small segment: [4 KiB allocated][rest free]
			ti.x.Flush()
			bk := ti.x.buckets
			for w := range bk.words {
				bk.words[w] = 0
			}
			return ti
		}},
		{"a size bucket out of heap order", "not a heap by address", func() *testIndex {
			ti := fourFreeSmallBlocks()
			bk := ti.x.buckets
			h := bk.heaps[0]
			h[0], h[1] = h[1], h[0]
			h[0].heapIdx, h[1].heapIdx = 0, 1
			bk.first[0] = h[0]
			return ti
		}},
		{"a block's heap position wrong", "heap position", func() *testIndex {
			ti := fourFreeSmallBlocks()
			ti.x.buckets.heaps[0][2].heapIdx = 3
			return ti
		}},
		{"a remembered best fit gone stale", "remembered best fit", func() *testIndex {
			ti := fourFreeSmallBlocks()
			bk := ti.x.buckets
			bk.bestFit(512)
			bk.memo = bk.heaps[0][1]
			return ti
		}},
		{"a size bucket's first block not its heap's root", "disagree", func() *testIndex {
			ti := fourFreeSmallBlocks()
			bk := ti.x.buckets
			bk.first[0] = bk.heaps[0][1]
			return ti
		}},
		{"a tree leaf underfull", "underfull", func() *testIndex {
			ti := newTestIndex(KindLarge)
			for range 200 { // 200 free segments of 130 MiB: 200 free blocks in the tree
				ti.segment(130 * mib)
			}
			l := ti.x.tree.first
			for l.n > 1 { // take blocks out behind the tree's back
				l.n--
				l.vals[l.n] = nil
			}
			return ti
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ti := c.breakIt()
			got := ti.check()
			if !strings.Contains(got, c.want) {
				t.Fatalf("the check reported %q, want a fault containing %q", got, c.want)
			}
		})
	}
	// The same indexes, unbroken, pass.
	for _, ti := range []*testIndex{fourFreeSmallBlocks(), func() *testIndex {
		ti := newTestIndex(KindLarge)
		for range 8 {
			ti.alloc(3*mib, 20*mib)
		}
		ti.segment(200 * mib)
		return ti
	}()} {
		if got := ti.check(); got != "" {
			t.Fatalf("an unbroken index fails its check: %s", got)
		}
	}
}

const mib = 1 << 20

// testSeg returns a segment of pool p with pages of page bytes (0: a
// plain one), whose blocks onSeg links to it.
func testSeg(p *Pool, page uint64) *Segment { return &Segment{pool: p, page: page} }

// onSeg makes seg b's segment, as the package's own code does (setSeg),
// and returns b.
func onSeg(b *Block, seg *Segment) *Block {
	b.setSeg(seg)
	return b
}
