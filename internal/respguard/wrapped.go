package respguard

import "bytes"

// Base64 comes wrapped into lines: 76 columns and CRLF in MIME, 64 and LF in PEM, any width an
// upstream picks, and every decoder a sandbox would use skips the breaks. A needle can then sit
// on both sides of a break, which neither the raw scan nor the view of escapes sees whole.
//
// A window the view is built for anyway (it has escapes) leaves such breaks out there
// (view.fill). Any other window is read around its breaks only, since most breaks are not in
// base64 (an SSE field's end, a line of text): a region is the run of base64 characters and
// line breaks (raw CR and LF, JSON's \n and \r) on both sides of a break that has a base64
// character before it and one after it (or the window's end), up to a needle less one
// character each way. Each region is read as the view reads it, and one that reaches the end
// of the window holds back what may begin a needle, as the raw scan does.

// scanWrapped finds and overwrites the needles line breaks split in w[:end], a window without
// escapes the view reads, and returns how much of w[:end] may go on as far as they are
// concerned.
func (s *Scanner) scanWrapped(w []byte, end int, final bool) int {
	h := end
	reach := s.n.maxBody - 1
	var next breaks
	for i := 0; i < end; {
		k := next.from(w[:end], i)
		if k < 0 {
			break
		}
		i = k + breakAt(w[:end], k)
		if k == 0 || !base64Char[w[k-1]] && breakBefore(w, k) == 0 {
			continue // no base64 before it: a line of text ends
		}
		lo, left := regionStart(w, k, reach)
		if left == 0 {
			continue // breaks after breaks after text
		}
		hi, right := regionEnd(w[:end], k, reach)
		// A region shorter than every needle holds none (an SSE field's name and the next
		// field's, "content_block_delta\ndata", most often).
		if right > 0 && left+right >= s.n.minBody {
			s.findWrapped(w, lo, hi)
			i = max(i, hi)
		}
	}
	if final {
		return end
	}
	// What may begin a needle that a later break continues: the run of base64 characters and
	// breaks the window ends in, when it has a break.
	lo, _ := regionStart(w, end, reach)
	if nextBreak(w[lo:end], 0) >= 0 {
		s.v.fill(w[lo:end])
		if hd := s.n.held(s.v.dec); hd > 0 {
			h = lo + s.v.rawStart(len(s.v.dec)-hd)
		}
	}
	return h
}

// findWrapped overwrites the needles of the region w[lo:hi], read as the view reads it.
func (s *Scanner) findWrapped(w []byte, lo, hi int) {
	s.v.fill(w[lo:hi])
	s.n.each(s.v.dec, func(a, b int) {
		ra, rb := s.v.rawRange(a, b)
		s.redact(w, lo+ra, lo+rb, true)
	})
}

// breaks finds the line breaks of a window in order, raw or JSON-escaped (the backslash of \n
// or \r), each kind with bytes.IndexByte: the next LF, CR and backslash are remembered until
// passed.
type breaks struct {
	at    [3]int // the next '\n', '\r', '\\' at or after from, -1 when none is left
	valid bool
}

var breakBytes = [3]byte{'\n', '\r', '\\'}

// from is the index of the first line break at or after i in w, or -1.
func (b *breaks) from(w []byte, i int) int {
	for {
		k := -1
		for x, c := range breakBytes {
			if !b.valid || b.at[x] >= 0 && b.at[x] < i {
				b.at[x] = -1
				if j := bytes.IndexByte(w[i:], c); j >= 0 {
					b.at[x] = i + j
				}
			}
			if b.at[x] >= 0 && (k < 0 || b.at[x] < k) {
				k = b.at[x]
			}
		}
		b.valid = true
		if k < 0 || breakAt(w, k) > 0 {
			return k
		}
		i = k + 1 // a backslash that escapes something else
	}
}

// nextBreak is the index of the first line break at or after i in w, or -1.
func nextBreak(w []byte, i int) int {
	var b breaks
	return b.from(w, i)
}

// escapedAt reports whether the backslash at w[i] is itself escaped: an odd run of backslashes
// ends before it.
func escapedAt(w []byte, i int) bool {
	n := 0
	for j := i - 1; j >= 0 && w[j] == '\\'; j-- {
		n++
	}
	return n%2 == 1
}

// breakBefore is the length of the line break that ends at w[i] (exclusive), raw or escaped,
// or 0.
func breakBefore(w []byte, i int) int {
	switch {
	case i < 1:
		return 0
	case w[i-1] == '\n' || w[i-1] == '\r':
		return 1
	case i >= 2 && (w[i-1] == 'n' || w[i-1] == 'r') && w[i-2] == '\\' && !escapedAt(w, i-2):
		return 2
	}
	return 0
}

// breakAt is the length of the line break that begins at w[i], raw or escaped, or 0.
func breakAt(w []byte, i int) int {
	switch {
	case w[i] == '\n' || w[i] == '\r':
		return 1
	case w[i] == '\\' && i+1 < len(w) && (w[i+1] == 'n' || w[i+1] == 'r') && !escapedAt(w, i):
		return 2
	}
	return 0
}

// regionStart walks back from k over base64 characters and line breaks, at most reach
// characters: where the region begins and how many characters it holds before k.
func regionStart(w []byte, k, reach int) (lo, chars int) {
	lo = k
	for lo > 0 && chars < reach {
		if n := breakBefore(w, lo); n > 0 {
			lo -= n
			continue
		}
		run := lo
		for lo > 0 && chars < reach && base64Char[w[lo-1]] {
			lo--
			chars++
		}
		if lo == run {
			break // neither a break nor a base64 character
		}
		if lo > 0 && w[lo-1] == '\\' && (w[lo] == 'n' || w[lo] == 'r') && !escapedAt(w, lo-1) {
			lo++ // the run began with the letter of an escaped break: give it back
			chars--
		}
	}
	return lo, chars
}

// regionEnd walks on from the break at k over line breaks and base64 characters, at most reach
// characters: where the region ends and how many characters it holds after k.
func regionEnd(w []byte, k, reach int) (hi, chars int) {
	hi = k
	for hi < len(w) && chars < reach {
		if n := breakAt(w, hi); n > 0 {
			hi += n
			continue
		}
		run := hi
		for hi < len(w) && chars < reach && base64Char[w[hi]] {
			hi++
			chars++
		}
		if hi == run {
			break
		}
	}
	return hi, chars
}
