package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/sandgate/sandgate/internal/jsonscan"
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
// unescaping, as JSON parsers do), a top-level key that is not valid UTF-8 or that equals one
// of those read under Unicode case folding without being it ("MODEL", "Max_Tokens", "ſtream":
// Go's encoding/json and other case-insensitive decoders read those as the field), or a value
// of the wrong type. When several cap keys are present the largest counts.
//
// Agents send the whole conversation in every request, often hundreds of kilobytes, so this is
// one pass over the body that validates what it skips without decoding it, several times
// faster than encoding/json and without allocating per value (BenchmarkParseModelRequest).
func ParseModelRequest(body []byte) (ModelRequest, error) {
	mr := ModelRequest{MaxTokens: -1}
	s := jsonscan.New(body)
	s.Space()
	if s.Peek() != '{' {
		if s.AtEnd() {
			return mr, errors.New("model request body: empty")
		}
		return mr, errors.New("model request body: not a JSON object")
	}
	var seen [len(readKeys)]bool
	var refused error // a value Sandgate will not forward, as opposed to bad syntax
	err := s.Object(1, func(key []byte, escaped bool, val []byte) error {
		k, err := topKey(key, escaped)
		if err != nil {
			return err
		}
		if k < 0 {
			refused = foldedKey(key, escaped)
			return refused
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
		return mr, bodyError(err)
	}
	s.Space()
	if !s.AtEnd() {
		return mr, errors.New("model request body: data after the JSON object")
	}
	return mr, nil
}

// bodyError names a request body's syntax error as one.
func bodyError(err error) error {
	return fmt.Errorf("model request body: %w", err)
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

// foldedKey refuses a top-level key (raw, quotes included) that is not valid UTF-8, or that a
// case-insensitive decoder would take for one of readKeys.
func foldedKey(raw []byte, escaped bool) error {
	name := raw[1 : len(raw)-1]
	if escaped {
		var k string
		if err := json.Unmarshal(raw, &k); err != nil {
			return err
		}
		name = []byte(k)
	}
	if !utf8.Valid(raw) {
		return errors.New("model request body: a top-level key is not valid UTF-8")
	}
	if len(name) < len("model") || len(name) > 3*len("max_completion_tokens") {
		return nil // no key of this length folds to one read (a folded rune is at most 3 bytes)
	}
	for _, k := range readKeys {
		if strings.EqualFold(string(name), k) {
			return fmt.Errorf("model request body: key %q reads as %q to case-insensitive decoders; send %q", name, k, k)
		}
	}
	return nil
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
