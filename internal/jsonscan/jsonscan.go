// Package jsonscan reads JSON in one pass without decoding it: it validates what it skips (RFC
// 8259, as encoding/json reads it) and hands its callers the raw bytes of the members and
// elements they ask for. The proxy reads model requests and usage with it; the gateway reads
// the top level of upstream results. Keys are handed over raw: a caller that matches them must
// leave what encoding/json would match differently (escapes, other letter case) to
// encoding/json, or refuse, with Unambiguous, what readers read differently.
package jsonscan

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
)

// MaxDepth is the nesting encoding/json accepts; deeper bodies are refused as it would.
const MaxDepth = 10000

// Scanner reads one JSON text from the start of its bytes.
type Scanner struct {
	b []byte
	i int
}

// New is a Scanner of b, its cursor on the first byte.
func New(b []byte) Scanner { return Scanner{b: b} }

// AtEnd reports whether the cursor is past the last byte.
func (s *Scanner) AtEnd() bool { return s.i >= len(s.b) }

// ErrEnd is the error of a text that ends too early.
var ErrEnd = errors.New("unexpected end of JSON input")

// ASCIIKey is a raw key (quotes included) as the name it stands for, when it has no escapes
// and only ASCII; a key beyond ASCII may fold (encoding/json matches keys without regard to
// case and Unicode folding), one with escapes is not its raw bytes.
func ASCIIKey(key []byte, escaped bool) ([]byte, bool) {
	if escaped {
		return nil, false
	}
	for _, c := range key {
		if c >= 0x80 {
			return nil, false
		}
	}
	return key[1 : len(key)-1], true
}

// LowerKey is ASCIIKey for a key without capital letters: one that encoding/json can match to
// no field other than the one of exactly its name, when field names are lowercase.
func LowerKey(key []byte, escaped bool) ([]byte, bool) {
	name, ok := ASCIIKey(key, escaped)
	if !ok {
		return nil, false
	}
	for _, c := range name {
		if c >= 'A' && c <= 'Z' {
			return nil, false
		}
	}
	return name, true
}

// Members scans b, which must hold one JSON object and nothing else but whitespace, calling
// member with each of its members as Object does.
func Members(b []byte, member func(key []byte, escaped bool, val []byte) error) error {
	s := New(b)
	if err := s.Object(1, member); err != nil {
		return err
	}
	s.Space()
	if !s.AtEnd() {
		return s.unexpected("after the top-level value")
	}
	return nil
}

func (s *Scanner) unexpected(context string) error {
	if s.i >= len(s.b) {
		return ErrEnd
	}
	return fmt.Errorf("invalid character %q %s (offset %d)", s.b[s.i], context, s.i)
}

// Peek is the byte at the cursor, 0 at the end (never valid where Peek is used).
func (s *Scanner) Peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// Space moves the cursor past whitespace.
func (s *Scanner) Space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// key scans `"name" :` with the whitespace around it and returns the raw string; the cursor is
// left on the value's first byte.
func (s *Scanner) key() (raw []byte, escaped bool, err error) {
	s.Space()
	if s.Peek() != '"' {
		return nil, false, s.unexpected("looking for the beginning of an object key")
	}
	start := s.i
	if escaped, err = s.str(); err != nil {
		return nil, false, err
	}
	raw = s.b[start:s.i]
	s.Space()
	if s.Peek() != ':' {
		return nil, false, s.unexpected("after an object key")
	}
	s.i++
	s.Space() // the value starts at the cursor
	return raw, escaped, nil
}

// Object scans the object at the cursor, nested depth levels deep, calling member with each
// member's raw key (quotes included), whether the key has escapes, and its raw value. An error
// from member ends the scan and is returned.
func (s *Scanner) Object(depth int, member func(key []byte, escaped bool, val []byte) error) error {
	s.Space()
	if s.Peek() != '{' {
		return s.unexpected("looking for the beginning of an object")
	}
	s.i++
	s.Space()
	if s.Peek() == '}' {
		s.i++
		return nil
	}
	for {
		key, escaped, err := s.key()
		if err != nil {
			return err
		}
		start := s.i
		if err := s.value(depth, nil); err != nil {
			return err
		}
		if err := member(key, escaped, s.b[start:s.i]); err != nil {
			return err
		}
		s.Space()
		switch s.Peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return nil
		default:
			return s.unexpected("after an object member")
		}
	}
}

// Array scans the array at the cursor, nested depth levels deep, calling elem with each
// element's raw value. An error from elem ends the scan and is returned.
func (s *Scanner) Array(depth int, elem func(val []byte) error) error {
	s.Space()
	if s.Peek() != '[' {
		return s.unexpected("looking for the beginning of an array")
	}
	s.i++
	s.Space()
	if s.Peek() == ']' {
		s.i++
		return nil
	}
	for {
		s.Space()
		start := s.i
		if err := s.value(depth, nil); err != nil {
			return err
		}
		if err := elem(s.b[start:s.i]); err != nil {
			return err
		}
		s.Space()
		switch s.Peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return nil
		default:
			return s.unexpected("after an array element")
		}
	}
}

// plainString marks the bytes that stand for themselves inside a JSON string.
var plainString = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// Word-at-a-time masks: lsb*c holds byte c in every lane of a word, msb the lanes' top bits.
const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// shortRun is how many bytes str reads one at a time before it goes word by word (skipPlain):
// source code as JSON encodes it escapes a newline, a tab or a quote every few bytes, and on
// such runs the plain loop, inline in str, is faster.
const shortRun = 16

// skipPlain is the index of the first byte at or after i that does not stand for itself in a
// string (see plainString), or len(b). It tests eight bytes at a time: in base64 (an image in
// a model request) or prose it is about twice as fast as a loop over the bytes
// (BenchmarkSkipPlain, and BenchmarkParseModelRequest/scanner/screenshot in proxy). For each
// lane, (v-lsb)&^v sets the lane's top bit if v's byte is zero, and (w-lsb*0x20)&^w if w's
// byte is below 0x20; a borrow out of such a lane can also set the lanes above it, never those
// below. So the lowest lane set in the word is its first control character, quote or backslash.
func skipPlain(b []byte, i int) int {
	for i+8 <= len(b) {
		w := binary.LittleEndian.Uint64(b[i:])
		q, bs := w^(lsb*'"'), w^(lsb*'\\')
		if m := ((w-lsb*0x20)&^w | (q-lsb)&^q | (bs-lsb)&^bs) & msb; m != 0 {
			return i + bits.TrailingZeros64(m)/8
		}
		i += 8
	}
	for i < len(b) && plainString[b[i]] {
		i++
	}
	return i
}

// str scans a string starting at its opening quote.
func (s *Scanner) str() (escaped bool, err error) {
	b, i := s.b, s.i+1
	for {
		short := min(i+shortRun, len(b))
		for i < short && plainString[b[i]] {
			i++
		}
		if i == short {
			i = skipPlain(b, i)
		}
		if i >= len(b) {
			s.i = i
			return escaped, ErrEnd
		}
		switch b[i] {
		case '"':
			s.i = i + 1
			return escaped, nil
		case '\\':
			escaped = true
			if i+1 >= len(b) {
				s.i = len(b)
				return escaped, ErrEnd
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				for j := i + 2; j < i+6; j++ {
					if j >= len(b) {
						s.i = len(b)
						return escaped, ErrEnd
					}
					if !isHex(b[j]) {
						s.i = j
						return escaped, s.unexpected("in \\u escape")
					}
				}
				i += 6
			default:
				s.i = i + 1
				return escaped, s.unexpected("in string escape code")
			}
		default: // a control character
			s.i = i
			return escaped, s.unexpected("in string literal")
		}
	}
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// value scans one value (with the whitespace before it) nested depth levels deep, iteratively:
// a hostile body's nesting costs a byte of stack per level, not a goroutine stack frame. With
// kt set it also hands every key and every string with escapes to kt (Unambiguous).
func (s *Scanner) value(depth int, kt *keyTracker) error {
	var buf [64]byte
	open := buf[:0] // the containers around the cursor, '{' or '['
	for {
		s.Space()
		switch c := s.Peek(); {
		case c == '{' || c == '[':
			if depth+len(open)+1 > MaxDepth {
				return errors.New("exceeded max depth")
			}
			s.i++
			s.Space()
			if s.Peek() == c+2 { // '}' is '{'+2, ']' is '['+2
				s.i++
				break
			}
			open = append(open, c)
			if c == '{' {
				if err := s.memberKey(kt, true); err != nil {
					return err
				}
			}
			continue
		default:
			if err := s.scalar(c, kt); err != nil {
				return err
			}
		}
		// A value ended: close the containers it ends, or go on to the next element.
		for {
			if len(open) == 0 {
				return nil
			}
			s.Space()
			top, c := open[len(open)-1], s.Peek()
			if c == top+2 {
				s.i++
				open = open[:len(open)-1]
				if top == '{' && kt != nil {
					kt.close()
				}
				continue
			}
			if c != ',' {
				return s.unexpected("after a value")
			}
			s.i++
			if top == '{' {
				if err := s.memberKey(kt, false); err != nil {
					return err
				}
			}
			break
		}
	}
}

// scalar scans one string, literal or number starting with c; with kt set, a string with escapes
// goes to kt too.
func (s *Scanner) scalar(c byte, kt *keyTracker) error {
	switch {
	case c == '"':
		start := s.i
		escaped, err := s.str()
		if err != nil || !escaped || kt == nil {
			return err
		}
		return kt.value(s.b[start:s.i])
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '-' || c >= '0' && c <= '9':
		return s.number()
	}
	return s.unexpected("looking for the beginning of a value")
}

func (s *Scanner) literal(word string) error {
	for j := 0; j < len(word); j++ {
		if s.i >= len(s.b) {
			return ErrEnd
		}
		if s.b[s.i] != word[j] {
			return s.unexpected("in literal " + word)
		}
		s.i++
	}
	return nil
}

// number scans -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *Scanner) number() error {
	if s.Peek() == '-' {
		s.i++
	}
	switch c := s.Peek(); {
	case c == '0':
		s.i++
	case c >= '1' && c <= '9':
		s.digits()
	default:
		return s.unexpected("in numeric literal")
	}
	if s.Peek() == '.' {
		s.i++
		if !s.digits() {
			return s.unexpected("after decimal point in numeric literal")
		}
	}
	if c := s.Peek(); c == 'e' || c == 'E' {
		s.i++
		if c := s.Peek(); c == '+' || c == '-' {
			s.i++
		}
		if !s.digits() {
			return s.unexpected("in exponent of numeric literal")
		}
	}
	return nil
}

// digits scans [0-9]* and reports whether there was one.
func (s *Scanner) digits() bool {
	start := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i > start
}
