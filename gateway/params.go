package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/jsonscan"
)

// One reading of a sandbox's message. Policy reads a request's params as mcp-go decodes them
// (encoding/json: the last of a repeated key wins, keys match fields without regard to case,
// bytes that are not UTF-8 become U+FFFD); the upstream may read other bytes otherwise: a
// tools/call's arguments travel as the sandbox wrote them (RawArguments), so that integers
// past 2^53 keep their digits. The guard therefore refuses, before policy or mcp-go reads it,
// every message that JSON readers read differently (jsonscan.Unambiguous: a key twice in one
// object at any depth, after unescaping or under case folding; bytes that are not UTF-8;
// escapes of half a surrogate pair), and a tools/call whose arguments are not an object
// (policy would read none, the upstream would get them). The check covers the whole message
// of every method, responses and notifications included: what reaches an upstream from a
// sandbox is read once. It costs one more scan of the body (BenchmarkOneReading).

// readOnce is the refusal of a message that is not read alike by every reader, or nil.
func readOnce(body []byte, method string) *call.Refusal {
	if err := jsonscan.Unambiguous(body); err != nil {
		return call.Refuse(call.CodeBadParams, "params are read differently by different JSON readers: %v", err)
	}
	if method == string(mcp.MethodToolsCall) {
		if args := member(member(body, "params"), "arguments"); args != nil && args[0] != '{' && string(args) != "null" {
			return call.Refuse(call.CodeBadParams, "tools/call arguments must be a JSON object")
		}
	}
	return nil
}

// errFound ends a scan that found what it looked for.
var errFound = errors.New("found")

// member is the raw value of the member of obj, an unambiguous JSON object, that encoding/json
// reads as the field name (keys compared after unescaping, without regard to case); nil when
// obj has none or is not an object.
func member(obj []byte, name string) []byte {
	if len(obj) == 0 || obj[0] != '{' {
		return nil
	}
	var val []byte
	_ = jsonscan.Members(obj, func(key []byte, escaped bool, v []byte) error {
		k := key[1 : len(key)-1]
		if escaped {
			var s string
			if json.Unmarshal(key, &s) != nil {
				return nil
			}
			k = []byte(s)
		}
		if bytes.EqualFold(k, []byte(name)) {
			val = v
			return errFound
		}
		return nil
	})
	return val
}

// policyArguments are a tools/call's arguments as policy reads them: decoded from the bytes
// the upstream gets (RawArguments), numbers as written (json.Number), not as the nearest
// float64. A request made in-process without RawArguments has its decoded Arguments.
//
// Arguments without a number (most: names, paths, titles, bodies) are read as mcp-go read them
// from the same bytes: the two readings differ only in numbers, and the guard refused every
// message that readers read differently (readOnce), so they are equal
// (FuzzPolicyArgumentsAgreeWithAFreshDecoder). That saves a second decoding, 2.7 µs of every
// such tools/call (BenchmarkPolicyArguments).
func policyArguments(req mcp.CallToolRequest) (map[string]any, error) {
	raw := req.Params.RawArguments
	if len(raw) == 0 || string(raw) == "null" {
		return req.GetArguments(), nil
	}
	if args, ok := req.Params.Arguments.(map[string]any); ok && !hasNumber(raw) {
		return args, nil
	}
	d := argsDecoders.Get().(*argsDecoder)
	args, err := d.decode(raw)
	if d.ok {
		argsDecoders.Put(d)
	}
	if err != nil {
		return nil, fmt.Errorf("tools/call arguments: %w", err)
	}
	return args, nil
}

// argsDecoder reads arguments with numbers as written (json.Number). A json.Decoder reads a
// stream of values; an argsDecoder's stream is each call's arguments in turn (src is reset to
// the next), so a call makes neither a decoder nor its buffer: ~850 B of every tools/call.
// After a value is decoded whole and nothing is left of it, the stream is at the start of the
// next value, as a fresh decoder's is (TestArgsDecoderAgreesWithAFreshOne); a decoder that
// failed or did not end with its value is not used again.
type argsDecoder struct {
	src bytes.Reader
	dec *json.Decoder
	ok  bool // at the start of a value: decode may be called
}

var argsDecoders = sync.Pool{New: func() any { return newArgsDecoder() }}

func newArgsDecoder() *argsDecoder {
	d := &argsDecoder{ok: true}
	d.dec = json.NewDecoder(&d.src)
	d.dec.UseNumber()
	return d
}

// decode reads raw, one JSON value, as an object; after an error d must not be used again.
func (d *argsDecoder) decode(raw []byte) (map[string]any, error) {
	if !d.ok {
		return nil, errors.New("argsDecoder used after a failure")
	}
	d.src.Reset(raw)
	from := d.dec.InputOffset()
	var args map[string]any
	err := d.dec.Decode(&args)
	if err == nil && (d.src.Len() > 0 || d.dec.InputOffset()-from != int64(len(raw))) {
		// Bytes after the value, read or not: decoded by a fresh decoder as before, which reads
		// the first value and leaves the rest.
		d.ok = false
		return newArgsDecoder().decodeOnce(raw)
	}
	if err != nil {
		d.ok = false
		return nil, err
	}
	return args, nil
}

// decodeOnce is decode with a decoder that is then dropped.
func (d *argsDecoder) decodeOnce(raw []byte) (map[string]any, error) {
	d.src.Reset(raw)
	var args map[string]any
	err := d.dec.Decode(&args)
	d.ok = false
	return args, err
}

// hasNumber reports whether raw, valid JSON, holds a number: a '-' or a digit outside strings.
func hasNumber(raw []byte) bool {
	in := false
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; {
		case in && c == '\\':
			i++ // the escaped byte: a quote does not end the string
		case c == '"':
			in = !in
		case !in && (c == '-' || c >= '0' && c <= '9'):
			return true
		}
	}
	return false
}
