// This file holds the direct classes of large buckets: in the index of
// large buckets that takes a stream's small requests (the small pool's
// with expandable segments or the low_fragmentation policy; the large
// pool's under the planned policy, which sends them there), where blocks
// of up to 2 MiB come and go with almost every operation, each class
// below directClasses has its bucket at its own place in an array, found
// without the hash table; the classes above stay in the table.

package freeindex

// directClasses is the number of classes kept by class in a large
// buckets' direct array: blocks of up to 2 MiB.
const directClasses = 1 << 12

// KeepDirect gives x, an empty index of large buckets, the direct
// classes (160 KiB): for the index that takes its stream's small
// requests. On any other index it does nothing.
func (x *Index) KeepDirect() {
	if l := x.large; x.Kind == KindLarge && l.n == 0 && len(l.direct) == 0 {
		l.direct = make([]bucket, directClasses)
	}
}

// bucketOf returns the bucket of class c, or nil if no block is of it.
func (s *largeBuckets) bucketOf(c int) *bucket {
	if c < len(s.direct) {
		if bk := &s.direct[c]; bk.class != 0 {
			return bk
		}
		return nil
	}
	if i := s.slot(c); i >= 0 {
		return &s.tab[i]
	}
	return nil
}

// eachBucket calls f on every bucket that holds blocks, the direct
// classes in order and then the table's in table order, until f returns
// false.
func (s *largeBuckets) eachBucket(f func(*bucket) bool) {
	for i := range s.direct {
		if bk := &s.direct[i]; bk.class != 0 && !f(bk) {
			return
		}
	}
	for i := range s.tab {
		if bk := &s.tab[i]; bk.class != 0 && !f(bk) {
			return
		}
	}
}

// checkDirect verifies that the direct array holds each of its classes at
// its place and that the table holds none of them, and returns a
// description of the first fault found, or "".
func (s *largeBuckets) checkDirect() string {
	n := 0
	for c := range s.direct {
		if k := s.direct[c].class; k != 0 {
			n++
			if int(k) != c+1 {
				return "a direct class is not at its place"
			}
		}
	}
	if n != s.ndirect {
		return "the count of direct classes is wrong"
	}
	for _, bk := range s.tab {
		if len(s.direct) > 0 && bk.class != 0 && int(bk.class) <= directClasses {
			return "a direct class is in the table"
		}
	}
	return ""
}
