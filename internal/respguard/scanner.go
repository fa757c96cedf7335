package respguard

import (
	"bytes"
	"math/bits"
)

// Scanner finds credentials in a stream on its way to a sandbox and overwrites each in place
// with Marker (cut, or padded with '*', to the length it had), so that lengths stay true. It
// reads the stream three ways:
//
//   - raw: each needle as bytes;
//   - decoded: JSON escapes and percent escapes decoded (view), and the line breaks of
//     wrapped base64 left out (wrapped.go), each match overwritten over the escapes and breaks
//     that spell it;
//   - in pieces, for an event stream: the string values of one JSON key concatenated across
//     the stream's events (pieces), each piece overwritten.
//
// It holds back only what could still become a match: the longest tail of the window that
// begins a needle (raw or decoded), an escape the window ends inside, and a tail of pieces of
// at least pieceHold bytes; everything else goes on at once, so an event is passed on as soon
// as it arrived.
type Scanner struct {
	n        *Needles
	onHit    func()
	hits     int
	released int64   // the stream offset of the window's first byte
	p        *pieces // nil unless the stream is SSE
	v        view
	mark     int // marker bytes written in the current redaction
}

// Reset prepares s for a new stream: sse says whether to read it in pieces; onHit (if not
// nil) is called at each credential found.
func (s *Scanner) Reset(n *Needles, sse bool, onHit func()) {
	*s = Scanner{n: n, onHit: onHit, v: s.v}
	if sse && !n.Empty() {
		s.p = newPieces(n)
	}
}

// Hits is the number of credentials found so far.
func (s *Scanner) Hits() int { return s.hits }

// release gives the stream's lexer state back after the final Scan; s scans nothing more.
func (s *Scanner) release() {
	if s.p != nil {
		s.p.release()
		s.p = nil
	}
}

// Scan scrubs the window w in place. w[:carried] are the bytes the last Scan held back, the
// rest are new. It returns how many bytes of w may go on; the caller keeps the others as the
// start of the next window. final (the stream ended) lets everything go.
func (s *Scanner) Scan(w []byte, carried int, final bool) int {
	if s.n.Empty() {
		s.released += int64(len(w))
		return len(w)
	}
	if s.p != nil {
		s.p.lex(s, w, carried)
	}
	h := s.scan(w, final)
	if s.p != nil && !final {
		if hp := s.p.holdFrom(s.released + int64(len(w))); hp >= 0 {
			h = min(h, int(max(hp-s.released, 0)))
		}
	}
	s.released += int64(h)
	return h
}

// scan finds and overwrites the raw and decoded matches of w and returns how much of w may go
// on as far as they are concerned.
func (s *Scanner) scan(w []byte, final bool) int {
	s.n.each(w, func(a, b int) { s.redact(w, a, b, true) })
	// An escape the window ends inside is held, and what comes before it is read as if the
	// stream ended there: the escape may complete a needle that text begins.
	ie := len(w)
	if !final {
		ie = incompleteEscape(w)
	}
	decoded := s.v.decode(w[:ie], s.n)
	if decoded {
		s.n.each(s.v.dec, func(a, b int) {
			ra, rb := s.v.rawRange(a, b)
			s.redact(w, ra, rb, true)
		})
	}
	hw := ie
	if !decoded { // the view leaves out the breaks of wrapped base64; without it, look at them
		hw = s.scanWrapped(w, ie, final)
	}
	if final {
		return len(w)
	}
	h := min(ie-s.n.held(w[:ie]), hw)
	if decoded {
		if hd := s.n.held(s.v.dec); hd > 0 {
			h = min(h, s.v.rawStart(len(s.v.dec)-hd))
		}
		h = s.v.boundary(h)
	}
	return h
}

// redact overwrites w[a:b] with the marker; start begins a new marker.
func (s *Scanner) redact(w []byte, a, b int, start bool) {
	if start {
		s.mark = 0
		s.hits++
		if s.onHit != nil {
			s.onHit()
		}
	}
	for k := a; k < b; k++ {
		if s.mark < len(Marker) {
			w[k] = Marker[s.mark]
		} else {
			w[k] = '*'
		}
		s.mark++
	}
}

// held is the length of the longest suffix of w that begins some needle without completing
// it: the bytes that must wait for the next read. Only the lengths at which some needle holds
// w's last two bytes are tried (ends), longest first, and of those only the ones whose first
// byte and first two bytes may begin a needle (first, starts) are compared; then w's last
// byte alone.
func (n *Needles) held(w []byte) int {
	if n.maxBody == 0 || len(w) == 0 {
		return 0
	}
	tail := w[len(w)-min(len(w), n.maxBody-1):]
	if n.wide != nil {
		return n.wide.held(tail, n.body)
	}
	if len(tail) <= heldScanMax {
		return n.heldScan(tail)
	}
	last := tail[len(tail)-1]
	if len(tail) >= 2 {
		ends := n.ends[endHash(tail[len(tail)-2], last)*n.words:][:n.words]
		for k := (len(tail) - 1) / 64; k >= 0; k-- {
			lens := ends[k] // bit b: a suffix of length 64k+b+1
			if top := len(tail) - 64*k; top < 64 {
				lens &= 1<<top - 1
			}
			for lens != 0 {
				b := 63 - bits.LeadingZeros64(lens)
				lens &^= 1 << b
				i := len(tail) - (64*k + b + 1)
				if c := tail[i]; n.first[c/64]&(1<<(c%64)) == 0 {
					continue
				}
				if h := pairHash(tail[i], tail[i+1]); n.starts[h/64]&(1<<(h%64)) == 0 {
					continue
				}
				for _, x := range n.byFirst[tail[i]] {
					if h := n.heads[x]; int(h.n) > len(tail)-i && h.c1 == tail[i+1] && bytes.HasPrefix(n.body[x], tail[i:]) {
						return len(tail) - i
					}
				}
			}
		}
	}
	if n.first[last/64]&(1<<(last%64)) != 0 { // every needle is longer than one byte
		return 1
	}
	return 0
}

// heldScanMax is the longest tail held reads position by position (heldScan) rather than by the
// lengths ends gives. ends is a table of 256 buckets (6 KiB for a run's set) read at one bucket
// per string, and a Sandgate with many runs reads its run's set cold: a cache miss at each string
// of an answer, 30% of a small answer's scan with 4,096 runs' sets (BenchmarkReader/cold). The
// two filters of heldScan are a cache line each, warm after the answer's first string, and most
// strings of a model's answer (keys, ids, a stream's deltas) are shorter than this.
const heldScanMax = 48

// heldScan is held for a tail of a narrow set read position by position, longest suffix first.
// Its test of a position is held's, written out again: as one helper called at each position
// it cost BenchmarkHeld 12.1 → 14.3 ns (17.1 without the first filter inline).
func (n *Needles) heldScan(tail []byte) int {
	for i, c := range tail {
		if n.first[c/64]&(1<<(c%64)) == 0 {
			continue
		}
		if i == len(tail)-1 {
			return 1 // every needle is longer than one byte
		}
		if h := pairHash(c, tail[i+1]); n.starts[h/64]&(1<<(h%64)) == 0 {
			continue
		}
		for _, x := range n.byFirst[c] {
			if h := n.heads[x]; int(h.n) > len(tail)-i && h.c1 == tail[i+1] && bytes.HasPrefix(n.body[x], tail[i:]) {
				return len(tail) - i
			}
		}
	}
	return 0
}
