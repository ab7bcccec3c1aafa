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
				k, used := scanFast(buf, ops[n:], lines[n:], r.line, v)
				r.br.Discard(used)
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
// ("r ID STREAM", "s STREAM"), into ops and, numbered from line+1,
// lines, until ops is full or a line is not one of them (or not complete
// in buf, or, with v, breaks a rule of v). It returns the number of ops
// and of bytes it took. A line it takes is one that Next would read to
// the same op: no "\r", no more or fewer fields, and it is shorter than
// the buffer. With v, it applies each op to v's live IDs as Check would;
// an op that breaks a rule changes nothing and is not taken.
func scanFast(buf []byte, ops []Op, lines []int, line int, v *Validator) (n, used int) {
	lines = lines[:len(ops)] // as long as ops (nextBatch): no bounds checks below
	for ; n < len(ops); n++ {
		op := &ops[n]
		if len(op.Tag)|len(op.Name) != 0 {
			*op = Op{} // the fields below are set
		}
		// The line at buf[used:], as parseFast reads it (an r or s line as
		// parseFields would), with its "\n".
		i := used
		if i+3 >= len(buf) || buf[i+1] != ' ' {
			break
		}
		kind := buf[i]
		id, j := decimal(buf, i+2)
		if j < 0 || j >= len(buf) {
			break
		}
		var size, stream uint64
		switch kind {
		case 'f':
			if buf[j] != '\n' {
				return n, used
			}
			if v != nil {
				if _, ok := v.live.remove(id); !ok {
					return n, used
				}
			}
			op.Kind = Free
			used = j + 1
		case 'a':
			if buf[j] != ' ' {
				return n, used
			}
			var k int
			if size, k = decimal(buf, j+1); k < 0 || k >= len(buf) {
				return n, used
			}
			if buf[k] != '\n' {
				if buf[k] != ' ' {
					return n, used
				}
				if stream, k = decimal(buf, k+1); k < 0 || k >= len(buf) || buf[k] != '\n' {
					return n, used
				}
			}
			if v != nil && !v.live.add(id) {
				return n, used
			}
			op.Kind = Alloc
			used = k + 1
		case 'r':
			if buf[j] != ' ' {
				return n, used
			}
			var k int
			if stream, k = decimal(buf, j+1); k < 0 || k >= len(buf) || buf[k] != '\n' {
				return n, used
			}
			if v != nil {
				if _, ok := v.live.get(id); !ok {
					return n, used
				}
			}
			op.Kind = RecordStream
			used = k + 1
		case 's':
			if buf[j] != '\n' {
				return n, used
			}
			op.Kind = SyncStream
			id, stream = 0, id
			used = j + 1
		default:
			return n, used
		}
		op.ID, op.Size, op.Stream = id, size, stream
		line++
		lines[n] = line
	}
	return n, used
}
