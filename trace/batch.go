// This file holds the batched reads: Reader.NextBatch, and
// Validator.ReadBatch, which checks the ops as it reads them.

package trace

// NextBatch reads up to n ops into ops, n the shorter of len(ops) and
// len(lines), and the line number of ops[i] into lines[i], as that many
// calls of Next would, and returns how many it read. It stops early after
// a Mark op, so that a caller can act at the step boundary, and at the
// end of the trace or an error, which it returns with the ops read before
// it (io.EOF at the end; errors are final, as with Next). With n > 0, it
// reads at least one op or returns an error. Line then says, as after
// Next, the line of the last op read, or of the error.
//
// The a, f, r and s lines that make up nearly every trace are parsed
// straight from the read buffer, without a call per line; every other
// line (and any line of those kinds that is not plain decimals separated
// by single spaces) is read by Next, with its messages.
func (r *Reader) NextBatch(ops []Op, lines []int) (int, error) {
	return r.nextBatch(nil, ops, lines)
}

// ReadBatch reads a batch of ops from r, as r.NextBatch does, and checks
// each as Check does, as it reads it: it returns the number of ops read
// and applied, and stops at the first broken rule with Check's error (the
// op that broke it is read, and not applied). It reports no skips: a
// caller that calls MarkFailed uses Check.
func (v *Validator) ReadBatch(r *Reader, ops []Op, lines []int) (int, error) {
	return r.nextBatch(v, ops, lines)
}

// nextBatch is NextBatch, with the ops checked by v when v is not nil.
func (r *Reader) nextBatch(v *Validator, ops []Op, lines []int) (int, error) {
	m := min(len(ops), len(lines))
	ops, lines = ops[:m], lines[:m]
	n := 0
	for n < len(ops) {
		if r.err == nil && !r.pending {
			if buf, _ := r.br.Peek(r.br.Buffered()); len(buf) > 0 {
				k, used := scanFast(buf, ops[n:], v)
				r.br.Discard(used)
				// The lines taken are the next k. (r.line in a local: a
				// store to lines could change it, as far as the compiler
				// knows, so it would be read again at each.)
				first, taken := r.line+1, lines[n:n+k]
				for i := range taken {
					taken[i] = first + i
				}
				r.line += k
				if n += k; n == len(ops) {
					break
				}
			}
		}
		// A line that scanFast does not take (or whose ID breaks a rule:
		// Check says which).
		op, err := r.Next()
		if err != nil {
			return n, err
		}
		if v != nil {
			if _, err := v.Check(op, r.line); err != nil {
				return n, err
			}
		}
		ops[n], lines[n] = op, r.line
		n++
		if op.Kind == Mark {
			break
		}
	}
	return n, nil
}

// scanFast parses, from the start of buf, the complete lines (each ended
// by "\n") that parseFast takes, and the r and s lines of the same form
// ("r ID STREAM", "s STREAM"), into ops, until ops is full or a line is
// not one of them (or not complete in buf, or, with v, breaks a rule of
// v). It returns the number of ops and of bytes it took; the ops are of
// consecutive lines. A line it takes is one that Next would read to the
// same op: no "\r", no more or fewer fields, and it is shorter than the
// buffer. With v, it applies each op to v's live IDs as Check would; an
// op that breaks a rule changes nothing and is not taken.
//
// It is the replay's parser, written for few calls: the ID, an a line's
// size and a stream of one digit are read in place (moreDigits is
// inlined), the other numbers by number; the IDs of v's dense table are
// looked up in place, the rest through idSet's methods.
func scanFast(buf []byte, ops []Op, v *Validator) (n, used int) {
	var live *idSet
	var dense []uint8 // live's IDs below len(dense), in place
	if v != nil {
		live = &v.live
		dense = live.dense
	}
	for ; n < len(ops); n++ {
		// The line at buf[used:], as parseFast reads it (an r or s line as
		// parseFields would), with its "\n". The shortest is "f 0\n".
		i := used
		if i+3 >= len(buf) || buf[i+1] != ' ' {
			break
		}
		kind := buf[i]
		// The ID (of an s line, the stream), read as number reads it.
		id := uint64(buf[i+2]) - '0'
		if id > 9 {
			break
		}
		j := i + 3
		if id != 0 {
			id, j = moreDigits(buf, id, j, i+21)
		}
		if j >= len(buf) {
			break
		}
		var size, stream uint64
		switch kind {
		case 'f':
			if buf[j] != '\n' {
				return n, used
			}
			if id < uint64(len(dense)) {
				if dense[id] == 0 {
					return n, used
				}
				dense[id] = 0
				live.n--
			} else if live != nil {
				if _, ok := live.remove(id); !ok {
					return n, used
				}
			}
			ops[n].Kind = Free
			used = j + 1
		case 'a':
			if buf[j] != ' ' {
				return n, used
			}
			// The size, as the ID above.
			k := j + 1
			if k >= len(buf) {
				return n, used
			}
			if size = uint64(buf[k] - '0'); size > 9 {
				return n, used
			}
			k++
			if size != 0 {
				size, k = moreDigits(buf, size, k, j+20)
			}
			if k >= len(buf) {
				return n, used
			}
			if buf[k] != '\n' {
				if buf[k] != ' ' {
					return n, used
				}
				// A stream of one digit (nearly every trace's) in place.
				if k+2 < len(buf) && buf[k+2] == '\n' && buf[k+1]-'0' <= 9 {
					stream, k = uint64(buf[k+1]-'0'), k+2
				} else if stream, k = number(buf, k+1); k >= len(buf) || buf[k] != '\n' {
					return n, used
				}
			}
			if id < uint64(len(dense)) {
				if dense[id] != 0 {
					return n, used
				}
				dense[id] = 1
				live.n++
			} else if live != nil {
				if !live.add(id) {
					return n, used
				}
				dense = live.dense // add may have grown it
			}
			ops[n].Kind = Alloc
			used = k + 1
		case 'r':
			if buf[j] != ' ' {
				return n, used
			}
			var k int
			if stream, k = number(buf, j+1); k >= len(buf) || buf[k] != '\n' {
				return n, used
			}
			if live != nil {
				if _, ok := live.get(id); !ok {
					return n, used
				}
			}
			ops[n].Kind = RecordStream
			used = k + 1
		case 's':
			if buf[j] != '\n' {
				return n, used
			}
			ops[n].Kind = SyncStream
			id, stream = 0, id
			used = j + 1
		default:
			return n, used
		}
		op := &ops[n]
		if len(op.Tag)|len(op.Name)|int(op.Flags) != 0 {
			kind := op.Kind
			*op = Op{Kind: kind} // the fields below are set
		}
		op.ID, op.Size, op.Stream = id, size, stream
	}
	return n, used
}

// number reads the decimal number that starts at buf[j], for scanFast, and
// returns it and the index after it: its digits, at most 19 of them,
// without a leading zero, as decimal reads them; or len(buf) when there
// is no digit at j (j past the end included), which scanFast does not
// take. It stops after a first digit 0 and after a 19th digit: scanFast
// then takes the number only if a space or "\n" follows, so a number that
// decimal would refuse (a leading zero, 20 digits or more) is never taken.
// scanFast reads its most frequent numbers in place, as number does.
func number(buf []byte, j int) (x uint64, k int) {
	if j >= len(buf) || buf[j]-'0' > 9 {
		return 0, len(buf)
	}
	d := buf[j] - '0'
	x, k = uint64(d), j+1
	if d == 0 {
		return x, k
	}
	return moreDigits(buf, x, k, j+19)
}

// moreDigits reads on the digits of a number from buf[k] (x, its value so
// far, not 0), to the first byte that is not a digit or to end (the
// index after the number's 19th digit), and returns the number's value
// and the index after its last digit. It is inlined: in scanFast's loop,
// a call would spill and reload the values scanFast keeps in registers.
func moreDigits(buf []byte, x uint64, k, end int) (uint64, int) {
	digits := buf[:min(len(buf), end)]
	for ; k < len(digits); k++ {
		d := digits[k] - '0'
		if d > 9 {
			break
		}
		x = x*10 + uint64(d)
	}
	return x, k
}
