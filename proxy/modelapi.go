package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// ModelRequest is what the proxy reads from a model-API request body for policy.
type ModelRequest struct {
	Model     string
	MaxTokens int64 // -1 when the body does not say
	Stream    bool
}

// readKeys are the top-level keys ParseModelRequest reads. Those after "stream" cap output
// tokens: Anthropic Messages and OpenAI Chat use max_tokens, OpenAI Chat also
// max_completion_tokens, OpenAI Responses max_output_tokens.
var readKeys = [...]string{"model", "stream", "max_tokens", "max_completion_tokens", "max_output_tokens"}

const (
	keyModel = iota
	keyStream
)

// readKey is the index of key in readKeys, or -1.
func readKey(key []byte) int {
	for i, k := range readKeys {
		if string(key) == k {
			return i
		}
	}
	return -1
}

// ParseModelRequest reads model, the output-token cap and stream from the top level of a JSON
// request body. It refuses what an upstream might read differently from Sandgate: a body that
// is not exactly one valid JSON object, a duplicated key among those read (keys compare after
// unescaping, as JSON parsers do), or a value of the wrong type. When several cap keys are
// present the largest counts.
//
// Agents send the whole conversation in every request, often hundreds of kilobytes, so this is
// one pass over the body that validates what it skips without decoding it, several times
// faster than encoding/json and without allocating per value (BenchmarkParseModelRequest).
func ParseModelRequest(body []byte) (ModelRequest, error) {
	mr := ModelRequest{MaxTokens: -1}
	s := jsonScan{b: body}
	s.space()
	if s.peek() != '{' {
		if s.i == len(s.b) {
			return mr, errors.New("model request body: empty")
		}
		return mr, errors.New("model request body: not a JSON object")
	}
	var seen [len(readKeys)]bool
	var refused error // a value Sandgate will not forward, as opposed to bad syntax
	err := s.object(1, func(key []byte, escaped bool, val []byte) error {
		k, err := topKey(key, escaped)
		if err != nil || k < 0 {
			return err
		}
		if seen[k] {
			refused = fmt.Errorf("model request body: key %q appears twice", readKeys[k])
			return refused
		}
		seen[k] = true
		refused = mr.set(k, val)
		return refused
	})
	if refused != nil {
		return mr, refused
	}
	if err != nil {
		return mr, s.wrap(err)
	}
	s.space()
	if s.i != len(s.b) {
		return mr, errors.New("model request body: data after the JSON object")
	}
	return mr, nil
}

// topKey is readKey of a raw key string (quotes included), unescaping it first when it has
// escapes: "mod\u0065l" is model to any upstream, so it is to Sandgate.
func topKey(raw []byte, escaped bool) (int, error) {
	if !escaped {
		return readKey(raw[1 : len(raw)-1]), nil
	}
	var k string
	if err := json.Unmarshal(raw, &k); err != nil {
		return -1, err
	}
	return readKey([]byte(k)), nil
}

// set reads the raw JSON value of readKeys[k] (valid JSON, already scanned).
func (mr *ModelRequest) set(k int, raw []byte) error {
	switch k {
	case keyModel:
		switch raw[0] {
		case 'n': // null: no model
		case '"':
			if bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
				mr.Model = string(raw[1 : len(raw)-1])
				return nil
			}
			return json.Unmarshal(raw, &mr.Model) // escapes, or bytes it replaces with U+FFFD
		default:
			return errors.New("model request body: model is not a string")
		}
	case keyStream:
		switch string(raw) {
		case "true":
			mr.Stream = true
		case "false", "null":
		default:
			return errors.New("model request body: stream is not a boolean")
		}
	default:
		name := readKeys[k]
		switch c := raw[0]; {
		case c == 'n':
		case c == '-' || c >= '0' && c <= '9':
			v, err := strconv.ParseInt(string(raw), 10, 64)
			if err != nil || v < 0 {
				return fmt.Errorf("model request body: %s is not a non-negative integer", name)
			}
			mr.MaxTokens = max(mr.MaxTokens, v)
		default:
			return fmt.Errorf("model request body: %s is not a number", name)
		}
	}
	return nil
}

// maxJSONDepth is the nesting encoding/json accepts; deeper bodies are refused as it would.
const maxJSONDepth = 10000

// jsonScan validates JSON (RFC 8259, as encoding/json reads it) without decoding it.
type jsonScan struct {
	b []byte
	i int
}

var errJSONEnd = errors.New("unexpected end of JSON input")

func (s *jsonScan) wrap(err error) error {
	return fmt.Errorf("model request body: %w", err)
}

func (s *jsonScan) unexpected(context string) error {
	if s.i >= len(s.b) {
		return errJSONEnd
	}
	return fmt.Errorf("invalid character %q %s (offset %d)", s.b[s.i], context, s.i)
}

// peek is the byte at the cursor, 0 at the end (never valid where peek is used).
func (s *jsonScan) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *jsonScan) space() {
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
func (s *jsonScan) key() (raw []byte, escaped bool, err error) {
	s.space()
	if s.peek() != '"' {
		return nil, false, s.unexpected("looking for the beginning of an object key")
	}
	start := s.i
	if escaped, err = s.str(); err != nil {
		return nil, false, err
	}
	raw = s.b[start:s.i]
	s.space()
	if s.peek() != ':' {
		return nil, false, s.unexpected("after an object key")
	}
	s.i++
	s.space() // the value starts at the cursor
	return raw, escaped, nil
}

// object scans the object at the cursor, nested depth levels deep, calling member with each
// member's raw key (quotes included), whether the key has escapes, and its raw value. An error
// from member ends the scan and is returned.
func (s *jsonScan) object(depth int, member func(key []byte, escaped bool, val []byte) error) error {
	s.space()
	if s.peek() != '{' {
		return s.unexpected("looking for the beginning of an object")
	}
	s.i++
	s.space()
	if s.peek() == '}' {
		s.i++
		return nil
	}
	for {
		key, escaped, err := s.key()
		if err != nil {
			return err
		}
		start := s.i
		if err := s.value(depth); err != nil {
			return err
		}
		if err := member(key, escaped, s.b[start:s.i]); err != nil {
			return err
		}
		s.space()
		switch s.peek() {
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

// plainString marks the bytes that stand for themselves inside a JSON string.
var plainString = func() (t [256]bool) {
	for c := 0x20; c < 256; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// str scans a string starting at its opening quote.
func (s *jsonScan) str() (escaped bool, err error) {
	b, i := s.b, s.i+1
	for {
		for i < len(b) && plainString[b[i]] {
			i++
		}
		if i >= len(b) {
			s.i = i
			return escaped, errJSONEnd
		}
		switch b[i] {
		case '"':
			s.i = i + 1
			return escaped, nil
		case '\\':
			escaped = true
			if i+1 >= len(b) {
				s.i = len(b)
				return escaped, errJSONEnd
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				for j := i + 2; j < i+6; j++ {
					if j >= len(b) {
						s.i = len(b)
						return escaped, errJSONEnd
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
// a hostile body's nesting costs a byte of stack per level, not a goroutine stack frame.
func (s *jsonScan) value(depth int) error {
	var buf [64]byte
	open := buf[:0] // the containers around the cursor, '{' or '['
	for {
		s.space()
		switch c := s.peek(); {
		case c == '{' || c == '[':
			if depth+len(open)+1 > maxJSONDepth {
				return errors.New("exceeded max depth")
			}
			s.i++
			s.space()
			if s.peek() == c+2 { // '}' is '{'+2, ']' is '['+2
				s.i++
				break
			}
			open = append(open, c)
			if c == '{' {
				if _, _, err := s.key(); err != nil {
					return err
				}
			}
			continue
		case c == '"':
			if _, err := s.str(); err != nil {
				return err
			}
		case c == 't':
			if err := s.literal("true"); err != nil {
				return err
			}
		case c == 'f':
			if err := s.literal("false"); err != nil {
				return err
			}
		case c == 'n':
			if err := s.literal("null"); err != nil {
				return err
			}
		case c == '-' || c >= '0' && c <= '9':
			if err := s.number(); err != nil {
				return err
			}
		default:
			return s.unexpected("looking for the beginning of a value")
		}
		// A value ended: close the containers it ends, or go on to the next element.
		for {
			if len(open) == 0 {
				return nil
			}
			s.space()
			top, c := open[len(open)-1], s.peek()
			if c == top+2 {
				s.i++
				open = open[:len(open)-1]
				continue
			}
			if c != ',' {
				return s.unexpected("after a value")
			}
			s.i++
			if top == '{' {
				if _, _, err := s.key(); err != nil {
					return err
				}
			}
			break
		}
	}
}

func (s *jsonScan) literal(word string) error {
	for j := 0; j < len(word); j++ {
		if s.i >= len(s.b) {
			return errJSONEnd
		}
		if s.b[s.i] != word[j] {
			return s.unexpected("in literal " + word)
		}
		s.i++
	}
	return nil
}

// number scans -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *jsonScan) number() error {
	if s.peek() == '-' {
		s.i++
	}
	switch c := s.peek(); {
	case c == '0':
		s.i++
	case c >= '1' && c <= '9':
		s.digits()
	default:
		return s.unexpected("in numeric literal")
	}
	if s.peek() == '.' {
		s.i++
		if !s.digits() {
			return s.unexpected("after decimal point in numeric literal")
		}
	}
	if c := s.peek(); c == 'e' || c == 'E' {
		s.i++
		if c := s.peek(); c == '+' || c == '-' {
			s.i++
		}
		if !s.digits() {
			return s.unexpected("in exponent of numeric literal")
		}
	}
	return nil
}

// digits scans [0-9]* and reports whether there was one.
func (s *jsonScan) digits() bool {
	start := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i > start
}
