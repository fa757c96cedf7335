package respguard

import (
	"bytes"
	"sort"
	"unicode/utf16"
	"unicode/utf8"
)

// view is a text with its JSON escapes (\uXXXX, surrogate pairs, \n, \/ …) and percent escapes
// (%XX) decoded, one layer: what a sandbox reads after JSON.parse or decodeURIComponent. Each
// escape is a unit; every other byte stands for itself.
//
// A line break right after a base64 character (CR or LF, raw or escaped) is left out of the
// view: base64 is wrapped into lines (76 columns in MIME, 64 in PEM, any width an upstream
// picks), and every decoder a sandbox would use skips the breaks. Such a break is a unit that
// decodes to nothing. A key's own characters are base64 characters too, so a key broken over
// two lines is read whole as well.
type view struct {
	dec   []byte
	units []unit
}

// unit is one escape: its decoded bytes at dec, its raw bytes at raw.
type unit struct {
	dec, decLen, raw, rawLen int
}

// decode fills v with the view of b and reports whether it can hold a needle that b itself
// does not: whether b has a \u or percent escape, or a short escape of a byte some needle
// holds. Otherwise v is not filled.
func (v *view) decode(b []byte, n *Needles) bool {
	if !mayHide(b, n) {
		return false
	}
	v.fill(b)
	return true
}

// fill makes v the view of b.
func (v *view) fill(b []byte) {
	v.dec, v.units = v.dec[:0], v.units[:0]
	var next stops
	for i := 0; i < len(b); {
		j := next.from(b, i)
		v.dec = append(v.dec, b[i:j]...)
		if j == len(b) {
			break
		}
		i = j
		if isBreak(b[i]) {
			if v.wrapped() { // a line break inside wrapped base64: not part of the text
				v.units = append(v.units, unit{dec: len(v.dec), raw: i, rawLen: 1})
			} else {
				v.dec = append(v.dec, b[i])
			}
			i++
			continue
		}
		dec, rawLen := escapeAt(b, i)
		if rawLen == 0 { // not an escape: the byte stands for itself
			v.dec = append(v.dec, b[i])
			i++
			continue
		}
		if len(dec) == 1 && isBreak(dec[0]) && v.wrapped() {
			dec = nil // an escaped line break inside wrapped base64
		}
		v.units = append(v.units, unit{dec: len(v.dec), decLen: len(dec), raw: i, rawLen: rawLen})
		v.dec = append(v.dec, dec...)
		i += rawLen
	}
}

// wrapped reports whether a line break here would break base64 text: the view so far ends in a
// base64 character (earlier breaks after it are already left out).
func (v *view) wrapped() bool { return len(v.dec) > 0 && base64Char[v.dec[len(v.dec)-1]] }

func isBreak(c byte) bool { return c == '\n' || c == '\r' }

// base64Char holds the characters of the standard and URL base64 alphabets.
var base64Char = func() (t [256]bool) {
	for _, c := range []byte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_") {
		t[c] = true
	}
	return t
}()

// mayHide is the quick check of decode: is there an escape a needle's byte could hide in? (A
// text with line breaks but no such escape is read around its breaks only: wrapped.go.)
func mayHide(b []byte, n *Needles) bool {
	for i := bytes.IndexByte(b, '\\'); i >= 0 && i+1 < len(b); {
		if n.escapes(b[i+1]) {
			return true
		}
		k := bytes.IndexByte(b[i+2:], '\\')
		if k < 0 {
			break
		}
		i += 2 + k
	}
	for i := bytes.IndexByte(b, '%'); i >= 0; {
		if i+2 < len(b) && isHex(b[i+1]) && isHex(b[i+2]) {
			return true
		}
		k := bytes.IndexByte(b[i+1:], '%')
		if k < 0 {
			break
		}
		i += 1 + k
	}
	return false
}

// stops finds where the view's plain runs end: the next '\', '%', LF and CR of a text, each
// with bytes.IndexByte and remembered until passed, so that a long text is not searched to
// its end again at each escape.
type stops struct {
	at    [4]int // -1: none left
	valid bool
}

var stopBytes = [4]byte{'\\', '%', '\n', '\r'}

// from is the index of the first '\', '%' or raw line break at or after i in b, or len(b).
func (s *stops) from(b []byte, i int) int {
	k := len(b)
	for x, c := range stopBytes {
		if !s.valid || s.at[x] >= 0 && s.at[x] < i {
			s.at[x] = -1
			if j := bytes.IndexByte(b[i:], c); j >= 0 {
				s.at[x] = i + j
			}
		}
		if s.at[x] >= 0 {
			k = min(k, s.at[x])
		}
	}
	s.valid = true
	return k
}

// shortEscapes is the byte each short JSON escape (the character after its backslash) stands
// for; 0 for a character that begins none.
var shortEscapes = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// escapeAt decodes the escape at b[i] ('\' or '%'); rawLen is 0 when there is none.
func escapeAt(b []byte, i int) (dec []byte, rawLen int) {
	if b[i] == '%' {
		if i+2 < len(b) && isHex(b[i+1]) && isHex(b[i+2]) {
			return []byte{unhex(b[i+1])<<4 | unhex(b[i+2])}, 3
		}
		return nil, 0
	}
	if i+1 >= len(b) {
		return nil, 0
	}
	if c := shortEscapes[b[i+1]]; c != 0 {
		return []byte{c}, 2
	}
	r, ok := hex4(b, i)
	if !ok {
		return nil, 0
	}
	rawLen = 6
	if utf16.IsSurrogate(r) {
		lo, ok := hex4(b, i+6)
		if ok && utf16.DecodeRune(r, lo) != utf8.RuneError {
			r, rawLen = utf16.DecodeRune(r, lo), 12
		} else {
			r = utf8.RuneError
		}
	}
	return utf8.AppendRune(nil, r), rawLen
}

// hex4 reads "\uXXXX" at b[i].
func hex4(b []byte, i int) (rune, bool) {
	if i+6 > len(b) || b[i] != '\\' || b[i+1] != 'u' {
		return 0, false
	}
	var r rune
	for _, c := range b[i+2 : i+6] {
		if !isHex(c) {
			return 0, false
		}
		r = r<<4 | rune(unhex(c))
	}
	return r, true
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

// incompleteEscape is the index where b ends inside an escape (a later byte may complete it,
// or a low surrogate follow a high one), or len(b).
func incompleteEscape(b []byte) int {
	for i := len(b) - 1; i >= max(0, len(b)-11); i-- {
		switch b[i] {
		case '%':
			if len(b)-i < 3 {
				return i
			}
			return len(b)
		case '\\':
			switch rest := len(b) - i; {
			case rest == 1, b[i+1] == 'u' && rest < 6:
				return i
			case rest < 12 && isHighSurrogateAt(b, i):
				return i
			}
			return len(b)
		}
	}
	return len(b)
}

func isHighSurrogateAt(b []byte, i int) bool {
	r, ok := hex4(b, i)
	return ok && r >= 0xD800 && r < 0xDC00
}

// rawRange is the raw bytes of decoded bytes [d0, d1).
func (v *view) rawRange(d0, d1 int) (int, int) {
	return v.rawStart(d0), v.rawEnd(d1 - 1)
}

// unitAt is the index of the last unit starting at or before decoded byte d, or -1.
func (v *view) unitAt(d int) int {
	return sort.Search(len(v.units), func(i int) bool { return v.units[i].dec > d }) - 1
}

func (v *view) rawStart(d int) int {
	i := v.unitAt(d)
	if i < 0 {
		return d
	}
	u := v.units[i]
	if d < u.dec+u.decLen {
		return u.raw
	}
	return u.raw + u.rawLen + d - (u.dec + u.decLen)
}

func (v *view) rawEnd(d int) int {
	i := v.unitAt(d)
	if i >= 0 && d < v.units[i].dec+v.units[i].decLen {
		return v.units[i].raw + v.units[i].rawLen
	}
	return v.rawStart(d) + 1
}

// boundary moves raw index h back to the start of the unit it falls inside, if any, so that a
// held tail always begins where an escape begins.
func (v *view) boundary(h int) int {
	i := sort.Search(len(v.units), func(i int) bool { return v.units[i].raw >= h }) - 1
	if i >= 0 && h < v.units[i].raw+v.units[i].rawLen {
		return v.units[i].raw
	}
	return h
}
