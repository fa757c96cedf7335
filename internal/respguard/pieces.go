package respguard

import "bytes"

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

// piece is one decoded byte of a string value and the stream offsets of its raw bytes.
type piece struct {
	b          byte
	start, end int64
}

// keyView is the joined values of one key: the tail that may still begin a needle.
type keyView struct {
	tail []piece
}

// pieces lexes a stream for JSON strings.
type pieces struct {
	n      *Needles
	keys   map[string]*keyView
	key    string // the last key seen
	inStr  bool
	esc    []byte // an escape being read inside a string
	escAt  int64
	cur    []piece // the string being read (its first and last bytes when long)
	cut    bool    // cur lost its middle
	closed []piece // a string that ended, not yet known as key or value
	isOpen bool    // closed is waiting for the next byte that says which
	buf    []byte
	seq    []piece
}

func newPieces(n *Needles) *pieces {
	return &pieces{n: n, keys: map[string]*keyView{}}
}

// span is how many decoded bytes of a string matter: a needle less one.
func (p *pieces) span() int { return p.n.maxBody - 1 }

// lex reads the new bytes of w (from carried on) and overwrites the pieces of every
// credential they complete.
func (p *pieces) lex(s *Scanner, w []byte, carried int) {
	base := s.released
	for i := carried; i < len(w); {
		c := w[i]
		at := base + int64(i)
		if !p.inStr {
			if p.isOpen {
				if c == ' ' || c == '\t' || c == '\r' || c == '\n' {
					i++
					continue
				}
				p.settle(s, w, c == ':')
			}
			k := bytes.IndexByte(w[i:], '"')
			if k < 0 {
				return
			}
			i += k + 1
			p.inStr, p.cur, p.cut = true, p.cur[:0], false
			continue
		}
		if p.esc != nil {
			p.esc = append(p.esc, c)
			p.escape()
			i++
			continue
		}
		switch c {
		case '"':
			p.inStr = false
			p.closed, p.cur = append(p.closed[:0], p.cur...), p.cur[:0]
			p.isOpen = true
		case '\n': // a JSON string holds no line feed: this was not one
			p.inStr = false
		case '\\':
			p.esc, p.escAt = append(p.esc[:0], c), at
		default:
			j := i + plainRun(w[i:])
			p.addRun(w[i:j], base+int64(i))
			i = j
			continue
		}
		i++
	}
}

// escape decodes p.esc when it is complete.
func (p *pieces) escape() {
	e := p.esc
	if len(e) == 2 && e[1] != 'u' {
		d, ok := shortEscapes[e[1]]
		if !ok {
			d = e[1]
		}
		p.add(piece{d, p.escAt, p.escAt + 2})
		p.esc = nil
		return
	}
	if len(e) < 6 {
		if len(e) > 2 && !isHex(e[len(e)-1]) {
			p.esc = nil
		}
		return
	}
	dec, _ := escapeAt(e, 0)
	for _, b := range dec {
		p.add(piece{b, p.escAt, p.escAt + 6})
	}
	p.esc = nil
}

// plainRun is the length of the run of b before the first quote, backslash or line feed.
func plainRun(b []byte) int {
	end := len(b)
	for _, c := range []byte{'"', '\\', '\n'} {
		if k := bytes.IndexByte(b[:end], c); k >= 0 {
			end = k
		}
	}
	return end
}

// addRun appends the bytes b, at stream offset at, to the current string. Of a long run only
// what add would keep is added: the string's first and last span bytes.
func (p *pieces) addRun(b []byte, at int64) {
	n := p.span()
	if len(b) > 3*n {
		head := max(0, n-len(p.cur))
		for k := range head {
			p.add(piece{b[k], at + int64(k), at + int64(k) + 1})
		}
		if len(p.cur) > n {
			p.cur = p.cur[:n]
		}
		p.cut = true
		from := len(b) - n
		b, at = b[from:], at+int64(from)
	}
	for k := range b {
		p.add(piece{b[k], at + int64(k), at + int64(k) + 1})
	}
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
		p.key = keyString(p.closed)
		return
	}
	p.value(s, w, p.closed, p.cut)
}

func keyString(ps []piece) string {
	b := make([]byte, 0, min(len(ps), maxKeyLen))
	for _, x := range ps[:min(len(ps), maxKeyLen)] {
		b = append(b, x.b)
	}
	return string(b)
}

func (p *pieces) view(key string) *keyView {
	v := p.keys[key]
	if v == nil {
		if len(p.keys) >= maxPieceKeys {
			key = ""
			if v = p.keys[key]; v != nil {
				return v
			}
		}
		v = &keyView{}
		p.keys[key] = v
	}
	return v
}

// value joins str, a value of the current key, to that key's tail: a needle that begins in
// the tail and ends in str is overwritten in both; the new tail is what may still begin one.
func (p *pieces) value(s *Scanner, w []byte, str []piece, cut bool) {
	v := p.view(p.key)
	n := p.span()
	if len(v.tail) > 0 {
		head := str[:min(len(str), n)]
		p.seq = append(append(p.seq[:0], v.tail...), head...)
		p.buf = bytesOf(p.buf, p.seq)
		for _, nd := range p.n.body {
			for i := 0; i < len(v.tail); {
				j := bytes.Index(p.buf[i:], nd)
				if j < 0 || i+j >= len(v.tail) {
					break
				}
				i += j
				p.redact(s, w, p.seq[i:i+len(nd)])
				i++
			}
		}
	}
	if cut || len(str) >= n {
		p.seq = append(p.seq[:0], str[len(str)-min(len(str), n):]...)
	} else {
		p.seq = append(append(p.seq[:0], v.tail...), str...)
		p.seq = p.seq[len(p.seq)-min(len(p.seq), n):]
	}
	p.buf = bytesOf(p.buf, p.seq)
	h := p.n.held(p.buf)
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
		a, b := x.start-s.released, x.end-s.released
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
		v := p.keys[p.key]
		var tail []piece
		if v != nil {
			tail = v.tail
		}
		n := p.span()
		seq := append(append([]piece(nil), tail...), open[len(open)-min(len(open), n):]...)
		seq = seq[len(seq)-min(len(seq), n):]
		h := p.n.held(bytesOf(nil, seq))
		hold(seq[len(seq)-h:])
	}
	return from
}
