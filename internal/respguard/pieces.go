package respguard

import (
	"bytes"
	"slices"
	"sync"
)

// An event stream can hand a sandbox a credential in pieces: one event's text ends with its
// first bytes, the next event's text begins with the rest, and the sandbox joins the deltas. No
// window holds the whole value, raw or decoded. pieces reads the stream as a sandbox joining
// them would: the string values of each JSON key, decoded and concatenated in the order they
// came, whatever lies between them (the rest of the event, other events). A credential found
// across string values is overwritten in each piece that is still held.
//
// A tail of pieceHold bytes or more that begins a needle is held back (with everything after
// it) until the next value of that key settles it, for at most maxPieceSpan bytes of stream:
// a sandbox can learn at most pieceHold-1 leading bytes of a credential assembled this way.
// Shorter tails are not held, so that an ordinary stream of deltas is not delayed by a letter
// that happens to begin a needle.
const (
	pieceHold    = 4
	maxPieceSpan = 64 << 10
	maxPieceKeys = 64
	maxKeyLen    = 64
)

// piece is one decoded byte of a string value and where its raw bytes are: n bytes from
// stream offset start (one, or the 2 or 6 of the escape that spells it).
type piece struct {
	start int64
	b     byte
	n     uint8
}

func (x piece) end() int64 { return x.start + int64(x.n) }

// keyView is the joined values of one key: the tail that may still begin a needle.
type keyView struct {
	tail []piece
}

// pieces lexes a stream for JSON strings.
type pieces struct {
	n      *Needles
	keys   map[string]*keyView
	key    []byte // the last key seen (at most maxKeyLen bytes)
	inStr  bool
	esc    []byte // an escape being read inside a string (empty: none)
	escAt  int64
	cur    []piece // the string being read (its first and last bytes when long)
	cut    bool    // cur lost its middle
	closed []piece // a string that ended, not yet known as key or value
	isOpen bool    // closed is waiting for the next byte that says which
	buf    []byte
	seq    []piece
	spare  []*keyView // views of an earlier stream, for reuse
}

// piecesPool keeps the lexer state of finished streams: a response relayed whole gives its
// state back (Scanner.release), and the next stream starts with its buffers and key views
// instead of making them again (BenchmarkScrub: ~2.7 KB fewer per response).
var piecesPool = sync.Pool{New: func() any { return &pieces{keys: map[string]*keyView{}} }}

func newPieces(n *Needles) *pieces {
	p := piecesPool.Get().(*pieces)
	p.n = n
	return p
}

// release empties p and gives it back to the pool; its stream is over.
func (p *pieces) release() {
	for _, v := range p.keys {
		p.spare = append(p.spare, v)
	}
	clear(p.keys)
	*p = pieces{keys: p.keys, key: p.key[:0], esc: p.esc[:0], cur: p.cur[:0], closed: p.closed[:0], buf: p.buf[:0], seq: p.seq[:0], spare: p.spare}
	piecesPool.Put(p)
}

// span is how many decoded bytes of a string matter: a needle less one.
func (p *pieces) span() int { return p.n.maxBody - 1 }

// lex reads the new bytes of w (from carried on) and overwrites the pieces of every
// credential they complete.
//
// A string without escapes that ends in the window is not made into pieces: it stays a span of
// w (closedAt, closedEnd) until settle decides what it is. Most strings are such, and most of
// them are keys or values no needle can continue, which settle decides without pieces.
func (p *pieces) lex(s *Scanner, w []byte, carried int) {
	base := s.released
	var next runEnds
	run := -1                     // the string being read began at w[run] and is plain so far: not in cur
	closedAt, closedEnd := -1, -1 // the closed string is w[closedAt:closedEnd], not in closed
	for i := carried; i < len(w); {
		c := w[i]
		if !p.inStr {
			if p.isOpen {
				if c == ' ' || c == '\t' || c == '\r' || c == '\n' {
					i++
					continue
				}
				if closedAt >= 0 {
					p.settlePlain(s, w, c == ':', w[closedAt:closedEnd], base+int64(closedAt))
					closedAt = -1
				} else {
					p.settle(s, w, c == ':')
				}
			}
			k := quoteIn(w[i:])
			if k < 0 {
				break
			}
			i += k + 1
			p.inStr, p.cur, p.cut = true, p.cur[:0], false
			run = i
			continue
		}
		if len(p.esc) > 0 {
			p.esc = append(p.esc, c)
			p.escape()
			i++
			continue
		}
		switch c {
		case '"':
			p.inStr, p.isOpen = false, true
			if run >= 0 && i-run <= 3*p.span() {
				closedAt, closedEnd = run, i
			} else {
				p.endRun(w, &run, i, base)
				p.closed, p.cur = p.cur, p.closed[:0]
			}
			run = -1
		case '\n': // a JSON string holds no line feed: this was not one
			p.inStr, run = false, -1
		case '\\':
			p.endRun(w, &run, i, base)
			p.esc, p.escAt = append(p.esc[:0], c), base+int64(i)
		default:
			j := i + plainRun(w, i, &next)
			if run < 0 {
				p.addRun(w[i:j], base+int64(i))
			}
			i = j
			continue
		}
		i++
	}
	// What the next window continues is kept as pieces.
	if p.inStr {
		p.endRun(w, &run, len(w), base)
	}
	if closedAt >= 0 {
		p.closed, p.cut = appendPieces(p.closed[:0], w[closedAt:closedEnd], base+int64(closedAt)), false
	}
}

// quoteIn is the index of the first '"' in b, or -1. The next string of a JSON text is most
// often a few bytes on: a byte loop finds it before bytes.IndexByte would have started.
func quoteIn(b []byte) int {
	for i, c := range b[:min(len(b), 8)] {
		if c == '"' {
			return i
		}
	}
	if len(b) <= 8 {
		return -1
	}
	if k := bytes.IndexByte(b[8:], '"'); k >= 0 {
		return 8 + k
	}
	return -1
}

// endRun puts the plain run of the current string, w[*run:i], into cur: an escape or the
// window's end comes before its closing quote.
func (p *pieces) endRun(w []byte, run *int, i int, base int64) {
	if *run >= 0 {
		p.addRun(w[*run:i], base+int64(*run))
		*run = -1
	}
}

// appendPieces appends the plain bytes b, at stream offset at, to dst as pieces.
func appendPieces(dst []piece, b []byte, at int64) []piece {
	n := len(dst)
	dst = slices.Grow(dst, len(b))[:n+len(b)]
	for k, c := range b {
		dst[n+k] = piece{at + int64(k), c, 1}
	}
	return dst
}

// escape decodes p.esc when it is complete. A line break is left out of the joined values, as
// the view leaves it out of wrapped base64: pieces of a wrapped text join across it.
func (p *pieces) escape() {
	e := p.esc
	if len(e) == 2 && e[1] != 'u' {
		d := shortEscapes[e[1]]
		if d == 0 {
			d = e[1]
		}
		if !isBreak(d) {
			p.add(piece{p.escAt, d, 2})
		}
		p.esc = p.esc[:0]
		return
	}
	if len(e) < 6 {
		if len(e) > 2 && !isHex(e[len(e)-1]) {
			p.esc = p.esc[:0]
		}
		return
	}
	dec, _ := escapeAt(e, 0)
	for _, b := range dec {
		if !isBreak(b) {
			p.add(piece{p.escAt, b, 6})
		}
	}
	p.esc = p.esc[:0]
}

// plainRun is the length of the run of w from i before the first quote, backslash or line
// feed. Most strings of an event stream are short: a byte loop over the first shortRun bytes
// ends them in one pass; a longer run is searched byte kind by byte kind (bytes.IndexByte),
// each kind's next place in the window kept in next until passed, so that a long string with
// many escapes (a JSON body's text) is not searched to its end again at each one.
func plainRun(w []byte, i int, next *runEnds) int {
	b := w[i:]
	for k, c := range b[:min(len(b), shortRun)] {
		if endsRun[c] {
			return k
		}
	}
	if len(b) <= shortRun {
		return len(b)
	}
	end := len(w)
	for x, c := range [...]byte{'"', '\\', '\n'} {
		if at := next[x]; at == 0 || at != -1 && at < i+shortRun { // unknown, or passed
			next[x] = -1
			if k := bytes.IndexByte(w[i+shortRun:], c); k >= 0 {
				next[x] = i + shortRun + k
			}
		}
		if next[x] >= 0 {
			end = min(end, next[x])
		}
	}
	return end - i
}

// runEnds are the window offsets of the next '"', '\' and LF plainRun found (-1: none
// left in the window, 0: not looked for yet).
type runEnds [3]int

var endsRun = [256]bool{'"': true, '\\': true, '\n': true}

const shortRun = 32

// addRun appends the bytes b, at stream offset at, to the current string, keeping what add
// would keep: the whole string while it is at most 3*span bytes, else its first and last span
// bytes (and what lies between them up to 3*span), the middle dropped (cut).
func (p *pieces) addRun(b []byte, at int64) {
	n := p.span()
	if len(p.cur)+len(b) <= 3*n {
		p.cur = appendPieces(p.cur, b, at)
		return
	}
	if need := n - len(p.cur); need > 0 { // the string's head is not complete yet
		p.cur = appendPieces(p.cur, b[:need], at)
		b, at = b[need:], at+int64(need)
	}
	if len(b) >= n {
		p.cur = appendPieces(p.cur[:n], b[len(b)-n:], at+int64(len(b)-n))
	} else { // the last n: the end of what was kept after the head, then b
		rest := p.cur[n:]
		keep := min(len(rest), n-len(b))
		copy(p.cur[n:], rest[len(rest)-keep:])
		p.cur = appendPieces(p.cur[:n+keep], b, at)
	}
	p.cut = true
}

// add appends a decoded byte to the current string, keeping its first and last span bytes.
func (p *pieces) add(b piece) {
	p.cur = append(p.cur, b)
	if n := p.span(); len(p.cur) > 3*n {
		copy(p.cur[n:], p.cur[len(p.cur)-n:])
		p.cur, p.cut = p.cur[:2*n], true
	}
}

// settle decides what the string that ended was: a key (the next byte was ':') or a value of
// the last key.
func (p *pieces) settle(s *Scanner, w []byte, key bool) {
	p.isOpen = false
	if key {
		p.key = bytesOf(p.key, p.closed[:min(len(p.closed), maxKeyLen)])
		return
	}
	p.value(s, w, p.closed, p.cut)
}

// settlePlain is settle for a string without escapes, str at stream offset at, not in pieces.
func (p *pieces) settlePlain(s *Scanner, w []byte, key bool, str []byte, at int64) {
	if key {
		p.isOpen = false
		p.key = append(p.key[:0], str[:min(len(str), maxKeyLen)]...)
		return
	}
	// A value that no tail of its key waits for and that ends in nothing a needle begins
	// with leaves the key without a tail: value would find nothing more.
	v := p.lookup(p.key)
	if v == nil || len(v.tail) == 0 {
		if p.n.held(str[len(str)-min(len(str), p.span()):]) == 0 {
			p.isOpen = false
			if v != nil {
				v.tail = v.tail[:0]
			}
			return
		}
	}
	p.closed, p.cut = appendPieces(p.closed[:0], str, at), false
	p.settle(s, w, false)
}

// lookup is the view of key (the shared one past maxPieceKeys keys), or nil.
func (p *pieces) lookup(key []byte) *keyView {
	if v := p.keys[string(key)]; v != nil || len(p.keys) < maxPieceKeys {
		return v
	}
	return p.keys[""]
}

// view makes the view of key, when key first has a tail to keep: the keys of a stream whose
// values never end the way a needle begins have none (holdFrom reads every view).
func (p *pieces) view(key []byte) *keyView {
	if len(p.keys) >= maxPieceKeys {
		key = nil
		if v := p.keys[""]; v != nil {
			return v
		}
	}
	var v *keyView
	if k := len(p.spare) - 1; k >= 0 {
		v, p.spare = p.spare[k], p.spare[:k]
		v.tail = v.tail[:0]
	} else {
		v = &keyView{}
	}
	p.keys[string(key)] = v
	return v
}

// value joins str, a value of the current key, to that key's tail: a needle that begins in
// the tail and ends in str is overwritten in both; the new tail is what may still begin one.
func (p *pieces) value(s *Scanner, w []byte, str []piece, cut bool) {
	v := p.lookup(p.key)
	var tail []piece
	if v != nil {
		tail = v.tail
	}
	n := p.span()
	if len(tail) > 0 {
		head := str[:min(len(str), n)]
		p.seq = append(append(p.seq[:0], tail...), head...)
		p.buf = bytesOf(p.buf, p.seq)
		p.n.eachBefore(p.buf, len(tail), func(a, b int) { p.redact(s, w, p.seq[a:b]) })
	}
	if cut || len(str) >= n {
		p.seq = append(p.seq[:0], str[len(str)-min(len(str), n):]...)
	} else {
		p.seq = append(append(p.seq[:0], tail...), str...)
		p.seq = p.seq[len(p.seq)-min(len(p.seq), n):]
	}
	p.buf = bytesOf(p.buf, p.seq)
	h := p.n.held(p.buf)
	if v == nil {
		if h == 0 { // nothing to keep, and no view to empty
			return
		}
		v = p.view(p.key)
	}
	v.tail = append(v.tail[:0], p.seq[len(p.seq)-h:]...)
}

func bytesOf(buf []byte, ps []piece) []byte {
	buf = buf[:0]
	for _, x := range ps {
		buf = append(buf, x.b)
	}
	return buf
}

// redact overwrites the raw bytes of ps still in the window w.
func (p *pieces) redact(s *Scanner, w []byte, ps []piece) {
	first := true
	for _, x := range ps {
		a, b := x.start-s.released, x.end()-s.released
		if a < 0 || b > int64(len(w)) {
			continue
		}
		s.redact(w, int(a), int(b), first)
		first = false
	}
	if first { // nothing left to overwrite: still a credential found
		s.hits++
		if s.onHit != nil {
			s.onHit()
		}
	}
}

// holdFrom is the stream offset from which bytes must wait for more pieces, or -1; end is the
// stream offset just past the window.
func (p *pieces) holdFrom(end int64) int64 {
	from := int64(-1)
	hold := func(ps []piece) {
		if len(ps) < pieceHold || end-ps[0].start > maxPieceSpan {
			return
		}
		if from < 0 || ps[0].start < from {
			from = ps[0].start
		}
	}
	for _, v := range p.keys {
		hold(v.tail)
	}
	// A string still being read (or not yet known as a key) may continue its key's tail.
	open := p.cur
	if p.isOpen {
		open = p.closed
	}
	if (p.inStr || p.isOpen) && len(open) > 0 {
		v := p.lookup(p.key)
		var tail []piece
		if v != nil {
			tail = v.tail
		}
		n := p.span()
		full := append(append([]piece(nil), tail...), open[len(open)-min(len(open), n):]...)
		// A needle the string already completes with its key's tail is overwritten once the
		// string is settled as a value: everything from its start waits for that, however
		// short the tail.
		buf := bytesOf(nil, full)
		if j := p.n.firstBefore(buf, len(tail)); j >= 0 && (from < 0 || full[j].start < from) {
			from = full[j].start
		}
		seq := full[len(full)-min(len(full), n):]
		h := p.n.held(bytesOf(buf[:0], seq))
		hold(seq[len(seq)-h:])
	}
	return from
}
