// This file holds the paged classes of large buckets: an index that keeps
// them (KeepPages) finds a class's bucket at its place in a page of the
// 64 classes of its word of l0, without the hash table. The index that
// takes a stream's small requests (the small pool's with expandable
// segments or the low_fragmentation policy; the large pool's under the
// planned policy, which sends them there) and the policy's large pool,
// whose blocks split and merge with almost every operation, keep them;
// the faithful modes' large pools keep the compact table.

package freeindex

import "math/bits"

// A classPage holds the buckets of the 64 classes of one word of l0, by
// class; a zero bucket is an empty class.
type classPage [64]bucket

// keptWords is how many words of l0, from the first, keep their pages
// when they empty: those of the classes of up to 2 MiB.
const keptWords = SmallBuffer / MinBlockSize / 64

// KeepPages makes x, an empty index of large buckets, keep its classes
// in pages: 32 KiB, and 2.5 KiB for each word of l0 with blocks (at most
// 10 MiB). A word of the classes of up to 2 MiB keeps its page when it
// empties (at most 160 KiB for all of them): small blocks come and go in
// the same few sizes, again and again, and a page taken and given back
// at each costs more than the blocks' filing. A larger word's page is
// kept for reuse by any word when the word empties. On any other index
// it does nothing.
func (x *Index) KeepPages() {
	if l := x.large; x.kind == KindLarge && l.l2 == 0 && l.pages == nil {
		l.pages = new([largeWords]*classPage)
	}
}

// newPage returns a zero page, reused when possible.
func (s *largeBuckets) newPage() *classPage {
	if n := len(s.spareP); n > 0 {
		p := s.spareP[n-1]
		s.spareP[n-1] = nil
		s.spareP = s.spareP[:n-1]
		return p
	}
	return new(classPage)
}

// bucketOf returns the bucket of class c, or nil if no block is of it.
func (s *largeBuckets) bucketOf(c int) *bucket {
	if w := c >> 6; s.pages != nil && w < largeWords {
		if p := s.pages[w]; p != nil && p[c&63].class != 0 {
			return &p[c&63]
		}
		return nil
	}
	if i := s.slot(c); i >= 0 {
		return &s.tab[i]
	}
	return nil
}

// eachBucket calls f on every bucket that holds blocks, the paged
// classes in order and then the table's in table order, until f returns
// false.
func (s *largeBuckets) eachBucket(f func(*bucket) bool) {
	if s.pages != nil { // the words with classes, through l2 and l1
		for m2 := s.l2; m2 != 0; m2 &= m2 - 1 {
			w1 := bits.TrailingZeros64(m2)
			for m1 := s.l1[w1]; m1 != 0; m1 &= m1 - 1 {
				w := w1<<6 | bits.TrailingZeros64(m1)
				p := s.pages[w]
				if p == nil {
					continue // a page missing is checkPages' fault
				}
				for i := range p {
					if bk := &p[i]; bk.class != 0 && !f(bk) {
						return
					}
				}
			}
		}
	}
	for i := range s.tab {
		if bk := &s.tab[i]; bk.class != 0 && !f(bk) {
			return
		}
	}
}

// checkPages verifies that an index keeping its classes in pages has a
// page for each word of l0 with blocks, each class at its place, no page
// for an empty word but a zero one for a word of classes up to 2 MiB
// (keptWords), zero spares, and no class in the table; it returns a
// description of the first fault found, or "".
func (s *largeBuckets) checkPages() string {
	if s.pages == nil {
		return ""
	}
	for w, p := range s.pages {
		if p == nil {
			if s.l0[w] != 0 {
				return "a word's page of classes is missing"
			}
			continue
		}
		if s.l0[w] == 0 && w >= keptWords {
			return "a large word's page is kept empty"
		}
		for i, bk := range p {
			if s.l0[w] == 0 && (bk.class != 0 || bk.first != nil || bk.heap != nil) {
				return "the page of an empty word is not zero"
			}
			if bk.class != 0 && int(bk.class) != w<<6|i+1 {
				return "a paged class is not at its place"
			}
		}
	}
	if s.used != 0 {
		return "a paged index has classes in its table"
	}
	for _, p := range s.spareP {
		for _, bk := range p {
			if bk.class != 0 || bk.first != nil || bk.heap != nil {
				return "a spare page of classes is not zero"
			}
		}
	}
	return ""
}
