// This file holds the memtrace v1 vocabulary: Kind, Op, the text form of an
// op, and the parser for one line that Reader uses.

package trace

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// Kind says what an Op does. Its value is the op's letter in memtrace, so
// Kind('a') is Alloc.
type Kind uint8

// The kinds of operation in a memtrace.
const (
	Alloc        Kind = 'a' // a ID BYTES [STREAM]: allocate BYTES on STREAM, call the block ID
	Free         Kind = 'f' // f ID: free the block called ID
	RecordStream Kind = 'r' // r ID STREAM: the block called ID is used on STREAM too
	SyncStream   Kind = 's' // s STREAM: work queued on STREAM so far has finished
	SyncDevice   Kind = 'S' // S: the whole device is synchronized
	EmptyCache   Kind = 'c' // c: empty the allocator's cache
	Tag          Kind = 't' // t [TAG]: allocations that follow belong to TAG; t alone clears it
	Mark         Kind = 'm' // m NAME: a step boundary named NAME (also written "# mark NAME")
	MakePool     Kind = 'P' // P NAME [no_split] [use_on_oom]: make the memory pool NAME
	UsePool      Kind = 'u' // u NAME STREAM: STREAM allocates in pool NAME; u - STREAM: in the default pool again
	BeginCapture Kind = 'g' // g NAME STREAM: begin a graph capture on STREAM into pool NAME
	EndCapture   Kind = 'e' // e STREAM: end the capture on STREAM
	PausePool    Kind = 'z' // z NAME: pause pool NAME (its physical memory goes, its addresses stay)
	ResumePool   Kind = 'w' // w NAME: resume pool NAME at the same addresses
	DropPool     Kind = 'd' // d NAME: release pool NAME
)

// DefaultPool is the NAME of a u line that routes a stream back to the
// default pool: "u - STREAM".
const DefaultPool = "-"

// PoolFlags are the options of a P line.
type PoolFlags uint8

// The options of a P line, written after its NAME in this order.
const (
	NoSplit  PoolFlags = 1 << iota // no_split: the pool's blocks are never split
	UseOnOOM                       // use_on_oom: the default pool may take the pool's free blocks before out of memory
)

// poolFlagNames are the words of the options, in the order of their bits.
var poolFlagNames = [...]string{"no_split", "use_on_oom"}

// String names the kind in words ("alloc", "free", ...), for messages.
func (k Kind) String() string {
	switch k {
	case Alloc:
		return "alloc"
	case Free:
		return "free"
	case RecordStream:
		return "record-stream"
	case SyncStream:
		return "sync-stream"
	case SyncDevice:
		return "sync-device"
	case EmptyCache:
		return "empty-cache"
	case Tag:
		return "tag"
	case Mark:
		return "mark"
	case MakePool:
		return "make-pool"
	case UsePool:
		return "use-pool"
	case BeginCapture:
		return "begin-capture"
	case EndCapture:
		return "end-capture"
	case PausePool:
		return "pause-pool"
	case ResumePool:
		return "resume-pool"
	case DropPool:
		return "drop-pool"
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Valid reports whether k is one of the kinds above.
func (k Kind) Valid() bool {
	switch k {
	case Alloc, Free, RecordStream, SyncStream, SyncDevice, EmptyCache, Tag, Mark,
		MakePool, UsePool, BeginCapture, EndCapture, PausePool, ResumePool, DropPool:
		return true
	}
	return false
}

// Op is one operation of a trace: one memtrace line. Fields a kind does not
// use are zero: ID for Alloc, Free and RecordStream; Size for Alloc; Stream
// for Alloc, RecordStream, SyncStream, UsePool, BeginCapture and
// EndCapture; Tag for Tag; Name for Mark and the pool lines but EndCapture
// (a pool's name; DefaultPool in a UsePool); Flags for MakePool.
type Op struct {
	Kind   Kind
	ID     uint64
	Size   uint64
	Stream uint64
	Tag    string
	Name   string
	Flags  PoolFlags
}

// String returns the op's memtrace line without the newline. An op that
// Check rejects is shown in Go syntax instead, so that it is never mistaken
// for a valid line.
func (op Op) String() string {
	b, err := op.AppendText(nil)
	if err != nil {
		return fmt.Sprintf("trace.Op{Kind:%q, ID:%d, Size:%d, Stream:%d, Tag:%q, Name:%q, Flags:%d}",
			byte(op.Kind), op.ID, op.Size, op.Stream, op.Tag, op.Name, op.Flags)
	}
	return string(b)
}

// AppendText appends the op's memtrace line, without the newline, to b. An
// Alloc always carries its stream, even stream 0. It returns Check's error
// for an op that has no memtrace form.
func (op Op) AppendText(b []byte) ([]byte, error) {
	if err := op.Check(); err != nil {
		return b, err
	}
	b = append(b, byte(op.Kind))
	switch op.Kind {
	case Alloc:
		b = append(b, ' ')
		b = strconv.AppendUint(b, op.ID, 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, op.Size, 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, op.Stream, 10)
	case Free:
		b = append(b, ' ')
		b = strconv.AppendUint(b, op.ID, 10)
	case RecordStream:
		b = append(b, ' ')
		b = strconv.AppendUint(b, op.ID, 10)
		b = append(b, ' ')
		b = strconv.AppendUint(b, op.Stream, 10)
	case SyncStream:
		b = append(b, ' ')
		b = strconv.AppendUint(b, op.Stream, 10)
	case Tag:
		if op.Tag != "" {
			b = append(b, ' ')
			b = append(b, op.Tag...)
		}
	case Mark, PausePool, ResumePool, DropPool:
		b = append(b, ' ')
		b = append(b, op.Name...)
	case MakePool:
		b = append(b, ' ')
		b = append(b, op.Name...)
		for i, w := range poolFlagNames {
			if op.Flags&(1<<i) != 0 {
				b = append(b, ' ')
				b = append(b, w...)
			}
		}
	case UsePool, BeginCapture:
		b = append(b, ' ')
		b = append(b, op.Name...)
		b = append(b, ' ')
		b = strconv.AppendUint(b, op.Stream, 10)
	case EndCapture:
		b = append(b, ' ')
		b = strconv.AppendUint(b, op.Stream, 10)
	}
	return b, nil
}

// Check reports whether the op can be written as a memtrace line and read
// back unchanged: a known kind, zero in the fields the kind does not use,
// a tag that is one field of printable UTF-8 without spaces, and for a
// mark a name of the same kind, which cannot be empty.
func (op Op) Check() error {
	if !op.Kind.Valid() {
		return fmt.Errorf("memtrace: unknown op kind %q", byte(op.Kind))
	}
	usesID := op.Kind == Alloc || op.Kind == Free || op.Kind == RecordStream
	usesStream := op.Kind == Alloc || op.Kind == RecordStream || op.Kind == SyncStream ||
		op.Kind == UsePool || op.Kind == BeginCapture || op.Kind == EndCapture
	usesName := op.Kind == Mark || poolKind(op.Kind) && op.Kind != EndCapture
	switch {
	case !usesID && op.ID != 0:
		return fmt.Errorf("memtrace: %s op has an ID (%d)", op.Kind, op.ID)
	case op.Kind != Alloc && op.Size != 0:
		return fmt.Errorf("memtrace: %s op has a size (%d)", op.Kind, op.Size)
	case !usesStream && op.Stream != 0:
		return fmt.Errorf("memtrace: %s op has a stream (%d)", op.Kind, op.Stream)
	case op.Kind != Tag && op.Tag != "":
		return fmt.Errorf("memtrace: %s op has a tag (%s)", op.Kind, Quote(op.Tag))
	case !usesName && op.Name != "":
		return fmt.Errorf("memtrace: %s op has a name (%s)", op.Kind, Quote(op.Name))
	case op.Kind != MakePool && op.Flags != 0:
		return fmt.Errorf("memtrace: %s op has pool options (%d)", op.Kind, op.Flags)
	case op.Flags >= 1<<len(poolFlagNames):
		return fmt.Errorf("memtrace: unknown pool options (%d)", op.Flags)
	}
	switch op.Kind {
	case Tag:
		if msg := checkTag(op.Tag); msg != "" {
			return fmt.Errorf("memtrace: tag %s: %s", Quote(op.Tag), msg)
		}
	case Mark:
		if op.Name == "" {
			return fmt.Errorf("memtrace: a mark needs a name")
		}
		if msg := checkTag(op.Name); msg != "" {
			return fmt.Errorf("memtrace: mark %s: %s", Quote(op.Name), msg)
		}
	case MakePool, UsePool, BeginCapture, PausePool, ResumePool, DropPool:
		if msg := checkPoolName(op.Name, op.Kind == UsePool); msg != "" {
			return fmt.Errorf("memtrace: %s: pool %s: %s", op.Kind, Quote(op.Name), msg)
		}
	}
	return nil
}

// poolKind reports whether k is one of the pool lines.
func poolKind(k Kind) bool {
	switch k {
	case MakePool, UsePool, BeginCapture, EndCapture, PausePool, ResumePool, DropPool:
		return true
	}
	return false
}

// checkPoolName returns why name cannot name a pool in a pool line, or "":
// it is one field as a mark's name is, and "-" (DefaultPool) only where
// the default pool may be named (a u line).
func checkPoolName[T string | []byte](name T, defaultOK bool) string {
	switch {
	case len(name) == 0:
		return "a pool needs a name"
	case string(name) == DefaultPool && !defaultOK:
		return `"-" is the default pool, which only a u line names`
	}
	return checkTag(name)
}

// checkTag returns why tag (a tag or a mark's name) cannot be a memtrace
// field, or "".
func checkTag[T string | []byte](tag T) string {
	for i := 0; i < len(tag); i++ {
		if c := tag[i]; c <= ' ' || c == 0x7f {
			if c == ' ' {
				return "a name is one field and cannot hold a space"
			}
			return "a name cannot hold control characters"
		}
	}
	if !utf8.ValidString(string(tag)) {
		return "a name must be valid UTF-8"
	}
	return ""
}

// opLetters lists the op letters, for messages.
const opLetters = "a f r s S c t m P u g e z w d"

// markPrefix opens a comment line that is a step mark: "# mark NAME".
const markPrefix = "# mark "

// markComment reports whether the comment line is exactly "# mark NAME"
// with NAME one valid field, and returns NAME. Such a comment is a Mark op,
// as the format says, for traces written before the m line existed.
func markComment[T string | []byte](line T) (T, bool) {
	if len(line) <= len(markPrefix) || string(line[:len(markPrefix)]) != markPrefix {
		return line[:0], false
	}
	name := line[len(markPrefix):]
	if checkTag(name) != "" {
		return line[:0], false
	}
	return name, true
}

// ParseOp parses one memtrace op line (without its newline). Comments and
// blank lines are not ops: ParseOp rejects them, except a comment that is
// exactly "# mark NAME", which is a Mark op.
func ParseOp(line string) (Op, error) {
	var p parser
	op, msg := p.parse([]byte(line))
	if msg != "" {
		return Op{}, newSyntaxError(0, []byte(line), msg)
	}
	return op, nil
}

// SyntaxError is a malformed memtrace line. Line is the 1-based line
// number (0 when the text did not come from a file), Text the line as read
// (cut to MaxQuote bytes, see Excerpt), Msg what is wrong with it.
type SyntaxError struct {
	Line int
	Text string
	Msg  string
}

func newSyntaxError(line int, text []byte, msg string) *SyntaxError {
	return &SyntaxError{Line: line, Text: Excerpt(text), Msg: msg}
}

func (e *SyntaxError) Error() string {
	if e.Line == 0 {
		return fmt.Sprintf("memtrace: %q: %s", e.Text, e.Msg)
	}
	return fmt.Sprintf("memtrace line %d: %q: %s", e.Line, e.Text, e.Msg)
}

// MaxLineLength is the longest line a Reader accepts, newline included. Ops
// are short; only a tag or a comment could come near it.
const MaxLineLength = 64 << 10

// parser turns the bytes of one op line into an Op without allocating,
// except for the first use of each tag or mark name.
type parser struct {
	tags map[string]string // interned tags and mark names, at most maxInternedTags
}

// maxInternedTags bounds the parser's tag table; a trace with more
// distinct tags than this pays one string per further tag line.
const maxInternedTags = 1024

// intern returns tag (a tag or a mark name) as a string, sharing one
// string per distinct value.
func (p *parser) intern(tag []byte) string {
	if s, ok := p.tags[string(tag)]; ok { // the lookup does not allocate
		return s
	}
	s := string(tag)
	if p.tags == nil {
		p.tags = make(map[string]string)
	}
	if len(p.tags) < maxInternedTags {
		p.tags[s] = s
	}
	return s
}

// parse parses an op line. On error it returns a message for SyntaxError.
func (p *parser) parse(line []byte) (Op, string) {
	if op, ok := parseFast(line); ok {
		return op, ""
	}
	return p.parseFields(line)
}

// parseFields parses an op line field by field: any line, with a message
// for what is wrong with it.
func (p *parser) parseFields(line []byte) (Op, string) {
	if len(line) == 0 {
		return Op{}, "empty line is not an op"
	}
	if line[0] == '#' {
		if name, ok := markComment(line); ok {
			return Op{Kind: Mark, Name: p.intern(name)}, ""
		}
		return Op{}, "a comment is not an op"
	}
	var fields [5][]byte
	n := 0
	start := 0
	for i := 0; i <= len(line); i++ {
		if i < len(line) && line[i] != ' ' {
			if c := line[i]; c < ' ' || c == 0x7f {
				return Op{}, "control character in line (fields are separated by single spaces)"
			}
			continue
		}
		if i == start {
			if i == len(line) {
				return Op{}, "trailing space (fields are separated by single spaces)"
			}
			return Op{}, "empty field (fields are separated by single spaces)"
		}
		if n == len(fields) {
			return Op{}, "too many fields"
		}
		fields[n] = line[start:i]
		n++
		start = i + 1
	}
	if len(fields[0]) != 1 {
		return Op{}, fmt.Sprintf("unknown op %s (want one of %s)", Quote(fields[0]), opLetters)
	}
	op := Op{Kind: Kind(fields[0][0])}
	args := fields[1:n]
	var msg string
	switch op.Kind {
	case Alloc:
		if len(args) < 2 || len(args) > 3 {
			return Op{}, fieldCount("a ID BYTES [STREAM]", len(args))
		}
		if op.ID, msg = parseUint(args[0], "ID"); msg != "" {
			return Op{}, msg
		}
		if op.Size, msg = parseUint(args[1], "size"); msg != "" {
			return Op{}, msg
		}
		if len(args) == 3 {
			if op.Stream, msg = parseUint(args[2], "stream"); msg != "" {
				return Op{}, msg
			}
		}
	case Free:
		if len(args) != 1 {
			return Op{}, fieldCount("f ID", len(args))
		}
		if op.ID, msg = parseUint(args[0], "ID"); msg != "" {
			return Op{}, msg
		}
	case RecordStream:
		if len(args) != 2 {
			return Op{}, fieldCount("r ID STREAM", len(args))
		}
		if op.ID, msg = parseUint(args[0], "ID"); msg != "" {
			return Op{}, msg
		}
		if op.Stream, msg = parseUint(args[1], "stream"); msg != "" {
			return Op{}, msg
		}
	case SyncStream:
		if len(args) != 1 {
			return Op{}, fieldCount("s STREAM", len(args))
		}
		if op.Stream, msg = parseUint(args[0], "stream"); msg != "" {
			return Op{}, msg
		}
	case SyncDevice, EmptyCache:
		if len(args) != 0 {
			return Op{}, fieldCount(string(rune(op.Kind)), len(args))
		}
	case Tag:
		if len(args) > 1 {
			return Op{}, "too many fields (want t [TAG]; a tag is one field)"
		}
		if len(args) == 1 {
			tag := args[0]
			if msg := checkTag(tag); msg != "" {
				return Op{}, msg
			}
			op.Tag = p.intern(tag)
		}
	case Mark:
		if len(args) != 1 {
			return Op{}, fieldCount("m NAME", len(args))
		}
		if msg := checkTag(args[0]); msg != "" {
			return Op{}, msg
		}
		op.Name = p.intern(args[0])
	case MakePool:
		if len(args) < 1 || len(args) > 3 {
			return Op{}, fieldCount("P NAME [no_split] [use_on_oom]", len(args))
		}
		if msg := checkPoolName(args[0], false); msg != "" {
			return Op{}, msg
		}
		op.Name = p.intern(args[0])
		next := 0 // the options come in their order, each once
		for _, w := range args[1:] {
			i := next
			for i < len(poolFlagNames) && string(w) != poolFlagNames[i] {
				i++
			}
			if i == len(poolFlagNames) {
				return Op{}, fmt.Sprintf("unknown or repeated pool option %s (want no_split, then use_on_oom, each at most once)", Quote(w))
			}
			op.Flags |= 1 << i
			next = i + 1
		}
	case UsePool, BeginCapture:
		if len(args) != 2 {
			return Op{}, fieldCount(string(rune(op.Kind))+" NAME STREAM", len(args))
		}
		if msg := checkPoolName(args[0], op.Kind == UsePool); msg != "" {
			return Op{}, msg
		}
		op.Name = p.intern(args[0])
		if op.Stream, msg = parseUint(args[1], "stream"); msg != "" {
			return Op{}, msg
		}
	case EndCapture:
		if len(args) != 1 {
			return Op{}, fieldCount("e STREAM", len(args))
		}
		if op.Stream, msg = parseUint(args[0], "stream"); msg != "" {
			return Op{}, msg
		}
	case PausePool, ResumePool, DropPool:
		if len(args) != 1 {
			return Op{}, fieldCount(string(rune(op.Kind))+" NAME", len(args))
		}
		if msg := checkPoolName(args[0], false); msg != "" {
			return Op{}, msg
		}
		op.Name = p.intern(args[0])
	default:
		return Op{}, fmt.Sprintf("unknown op %q (want one of %s)", fields[0], opLetters)
	}
	return op, ""
}

// parseFast parses the lines that make up nearly every trace, "a ID BYTES"
// with an optional " STREAM" and "f ID", with decimals of at most 19
// digits (which cannot overflow) and no leading zeros, in one pass over
// the bytes. It returns false for any other line, well-formed or not,
// which parse then reads field by field with its messages; for the lines
// it takes, it returns what parse returns.
func parseFast(line []byte) (op Op, ok bool) {
	if len(line) < 3 || line[1] != ' ' {
		return Op{}, false
	}
	id, i := decimal(line, 2)
	if i < 0 {
		return Op{}, false
	}
	switch line[0] {
	case 'f':
		return Op{Kind: Free, ID: id}, i == len(line)
	case 'a':
		if i == len(line) || line[i] != ' ' {
			return Op{}, false
		}
		size, j := decimal(line, i+1)
		if j < 0 {
			return Op{}, false
		}
		if j == len(line) {
			return Op{Kind: Alloc, ID: id, Size: size}, true
		}
		if line[j] != ' ' {
			return Op{}, false
		}
		stream, k := decimal(line, j+1)
		return Op{Kind: Alloc, ID: id, Size: size, Stream: stream}, k == len(line)
	}
	return Op{}, false
}

// decimal reads the decimal number of at most 19 digits (which cannot
// overflow), without a leading zero, that starts at line[i], and returns
// it and the index after it, or -1 when there is no such number there.
func decimal(line []byte, i int) (uint64, int) {
	start := i
	var x uint64
	for ; i < len(line); i++ {
		d := line[i] - '0'
		if d > 9 {
			break
		}
		x = x*10 + uint64(d)
	}
	if n := i - start; n == 0 || n > 19 || n > 1 && line[start] == '0' {
		return 0, -1
	}
	return x, i
}

func fieldCount(want string, got int) string {
	return fmt.Sprintf("wrong number of fields (want %s, got %d after the op letter)", want, got)
}

// parseUint parses a decimal uint64 with no sign and no leading zeros.
func parseUint(b []byte, what string) (uint64, string) {
	if len(b) == 0 {
		return 0, what + " is not a non-negative integer"
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, what + " is not a non-negative integer"
		}
	}
	if len(b) > 1 && b[0] == '0' {
		return 0, what + " has a leading zero"
	}
	var v uint64
	for _, c := range b {
		d := uint64(c - '0')
		if v > (1<<64-1-d)/10 {
			return 0, what + " is out of range (more than 2^64-1)"
		}
		v = v*10 + d
	}
	return v, ""
}
