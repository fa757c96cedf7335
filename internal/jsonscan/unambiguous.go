package jsonscan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"unicode"
	"unicode/utf8"
)

// ErrAmbiguous is the error of a valid JSON text that JSON readers read differently: Unambiguous
// refuses it.
var ErrAmbiguous = errors.New("JSON that readers read differently")

// Unambiguous checks that b, one JSON text and nothing else but whitespace, reads the same to
// every JSON reader, so that what Sandgate decides on is what an upstream acts on. It refuses,
// with an error wrapping ErrAmbiguous:
//   - bytes that are not UTF-8 (encoding/json reads them as U+FFFD, others keep them or fail);
//   - a key that appears twice in one object, at any depth: readers keep the first, the last,
//     or fail. Keys compare after unescaping ("a\u0062" is "ab") and under Unicode case folding
//     ("ID", "Id", "ſ" for "s"), since encoding/json and other decoders match struct fields
//     without regard to case;
//   - a \u escape of half a surrogate pair, in a key or a value (encoding/json reads it as
//     U+FFFD, JavaScript keeps it).
//
// Syntax errors are reported as Members reports them.
func Unambiguous(b []byte) error {
	if !utf8.Valid(b) {
		return fmt.Errorf("%w: not valid UTF-8", ErrAmbiguous)
	}
	s := New(b)
	kt := trackers.Get().(*keyTracker)
	defer kt.release()
	if err := s.value(0, kt); err != nil {
		return err
	}
	s.Space()
	if !s.AtEnd() {
		return s.unexpected("after the top-level value")
	}
	return nil
}

// memberKey scans an object member's key (the first of its object when first is set) and
// hands it to kt, when there is one.
func (s *Scanner) memberKey(kt *keyTracker, first bool) error {
	raw, escaped, err := s.key()
	if err != nil || kt == nil {
		return err
	}
	if first {
		kt.frames = append(kt.frames, keyFrame{start: len(kt.keys)})
	}
	return kt.add(raw, escaped)
}

// keyTracker holds the folded keys of the objects open around the scanner's cursor.
type keyTracker struct {
	keys   [][]byte // folded keys of the open objects, outermost first
	frames []keyFrame
	arena  []byte // folded keys that are not their own raw bytes
}

// trackers keeps keyTrackers between checks: a typical message is then checked without
// allocating (BenchmarkUnambiguous).
var trackers = sync.Pool{New: func() any {
	return &keyTracker{keys: make([][]byte, 0, 32), frames: make([]keyFrame, 0, 8)}
}}

// maxPooledKeys bounds the tracker kept for the next check: one that grew on a hostile message
// is left to the collector.
const maxPooledKeys = 1024

// release empties kt, dropping what points into the checked text, and keeps it for the next.
func (kt *keyTracker) release() {
	if cap(kt.keys) > maxPooledKeys || cap(kt.arena) > 64*maxPooledKeys {
		return
	}
	clear(kt.keys[:cap(kt.keys)])
	clear(kt.frames[:cap(kt.frames)])
	kt.keys, kt.frames, kt.arena = kt.keys[:0], kt.frames[:0], kt.arena[:0]
	trackers.Put(kt)
}

// keyFrame is one open object.
type keyFrame struct {
	start int                 // where its keys begin in keys
	set   map[string]struct{} // its keys once it has more than linearKeys (then not in keys)
}

// linearKeys is how many keys of one object are compared one by one before a map holds them:
// tool arguments have a few; a hostile object of 100,000 keys must not cost 10^10 compares.
const linearKeys = 16

func (kt *keyTracker) close() {
	f := kt.frames[len(kt.frames)-1]
	kt.keys = kt.keys[:f.start]
	kt.frames = kt.frames[:len(kt.frames)-1]
}

// add records a key (raw, quotes included) of the innermost open object and refuses one that
// repeats an earlier key of that object.
func (kt *keyTracker) add(raw []byte, escaped bool) error {
	name, err := kt.fold(raw, escaped)
	if err != nil {
		return err
	}
	f := &kt.frames[len(kt.frames)-1]
	if f.set != nil {
		if _, dup := f.set[string(name)]; dup {
			return repeatedKey(raw)
		}
		f.set[string(name)] = struct{}{}
		return nil
	}
	for _, k := range kt.keys[f.start:] {
		if bytes.Equal(k, name) {
			return repeatedKey(raw)
		}
	}
	kt.keys = append(kt.keys, name)
	if len(kt.keys)-f.start > linearKeys {
		f.set = make(map[string]struct{}, 4*linearKeys)
		for _, k := range kt.keys[f.start:] {
			f.set[string(k)] = struct{}{}
		}
		kt.keys = kt.keys[:f.start]
	}
	return nil
}

func repeatedKey(raw []byte) error {
	const show = 64
	if len(raw) > show {
		raw = append(raw[:show:show], "…"...)
	}
	return fmt.Errorf("%w: key %s repeats an earlier key of its object (keys compare after unescaping and case folding)",
		ErrAmbiguous, raw)
}

// fold is the name a raw key stands for with every rune replaced by one representative of
// its case-folding orbit (foldRune): two keys fold alike exactly when strings.EqualFold says
// their names are equal. A key of lowercase ASCII without escapes is its own folding and is
// not copied.
func (kt *keyTracker) fold(raw []byte, escaped bool) ([]byte, error) {
	name := raw[1 : len(raw)-1]
	if escaped {
		if loneSurrogate(name) {
			return nil, fmt.Errorf("%w: a key escapes half a surrogate pair", ErrAmbiguous)
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, err
		}
		name = []byte(s)
	}
	if !bytes.ContainsFunc(name, func(r rune) bool { return r >= utf8.RuneSelf || 'A' <= r && r <= 'Z' }) {
		return name, nil
	}
	start := len(kt.arena)
	for _, r := range string(name) {
		kt.arena = utf8.AppendRune(kt.arena, foldRune(r))
	}
	return kt.arena[start:len(kt.arena):len(kt.arena)], nil
}

// foldRune is the smallest rune of r's simple case-folding orbit (the runes strings.EqualFold
// takes for r), lowercased when it is an ASCII capital so that ASCII keys fold to themselves.
func foldRune(r rune) rune {
	if r < utf8.RuneSelf {
		if 'A' <= r && r <= 'Z' {
			r += 'a' - 'A'
		}
		return r
	}
	m := r
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		m = min(m, f)
	}
	if 'A' <= m && m <= 'Z' {
		m += 'a' - 'A'
	}
	return m
}

// value checks a string value with escapes (raw, quotes included).
func (kt *keyTracker) value(raw []byte) error {
	if loneSurrogate(raw[1 : len(raw)-1]) {
		return fmt.Errorf("%w: a string escapes half a surrogate pair", ErrAmbiguous)
	}
	return nil
}

// loneSurrogate reports whether s, the contents of a valid JSON string, has a \u escape of a
// surrogate that is not part of a high-low pair.
func loneSurrogate(s []byte) bool {
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			continue
		}
		if s[i+1] != 'u' {
			i++ // a two-byte escape, \\ included
			continue
		}
		switch v := hex4(s[i+2:]); {
		case v >= 0xdc00 && v <= 0xdfff:
			return true
		case v >= 0xd800 && v <= 0xdbff:
			if i+12 > len(s) || s[i+6] != '\\' || s[i+7] != 'u' {
				return true
			}
			if low := hex4(s[i+8:]); low < 0xdc00 || low > 0xdfff {
				return true
			}
			i += 11
		default:
			i += 5
		}
	}
	return false
}

// hex4 is the value of the four hex digits (already checked) at the start of b.
func hex4(b []byte) rune {
	var v rune
	for _, c := range b[:4] {
		switch {
		case c <= '9':
			c -= '0'
		case c >= 'a':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		v = v<<4 | rune(c)
	}
	return v
}
