// This file holds the count: the allocation stream summed exactly, with
// no allocator in between.

package estimate

// counter is the sink that counts: live bytes per category, each
// category's high-water mark, the high-water mark of their sum, and the
// peak of each phase.
type counter struct {
	next   uint64
	live   [numCategories]uint64
	high   [numCategories]uint64
	total  uint64
	peak   uint64
	phases []Phase
	at     string // the phase of the peak
}

func (c *counter) alloc(n uint64, cat category) (uint64, bool) {
	c.live[cat] = add(c.live[cat], n)
	c.high[cat] = max(c.high[cat], c.live[cat])
	c.total = add(c.total, n)
	if c.total > c.peak {
		c.peak = c.total
		if len(c.phases) > 0 {
			c.at = c.phases[len(c.phases)-1].Name
		}
	}
	if k := len(c.phases); k > 0 {
		c.phases[k-1].Counted = max(c.phases[k-1].Counted, int64(min(c.total, capBytes)))
	}
	c.next++
	return c.next, true
}

func (c *counter) free(_, n uint64, cat category) {
	c.live[cat] = sub(c.live[cat], n)
	c.total = sub(c.total, n)
}

func (c *counter) recategorize(n uint64, from, to category) {
	c.live[from] = sub(c.live[from], n)
	c.live[to] = add(c.live[to], n)
	c.high[to] = max(c.high[to], c.live[to])
}

func (c *counter) phase(name string) {
	c.phases = append(c.phases, Phase{Name: name, Counted: int64(min(c.total, capBytes))})
}

// count runs the program of pl through a counter.
func count(pl *Plan) (*counter, *program) {
	c := &counter{}
	p := newProgram(pl, c)
	p.run()
	return c, p
}

// sub subtracts, stopping at zero (a saturated sum is not exact).
func sub(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}
