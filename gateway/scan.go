package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/internal/jsonscan"
)

// Every forwarded result's top level is read twice besides its decoding: for the multi round-trip
// exchange (does it ask for input?) and for the fields the typed result has no place for
// (keepExtras). Both read it with one allocation-free scan each rather than a decoding, and leave
// to encoding/json every result whose keys it might read differently (a key with escapes, or
// one that is not ASCII, which encoding/json matches without regard to case and Unicode folding).
// BenchmarkResultTopLevel (a typical tool result): the two scans 0.43 µs and 3 allocations,
// the two decodings they replace 4.7 µs and 22.

// errLeaveToJSON ends a scan whose result encoding/json must read.
var errLeaveToJSON = errors.New("leave it to encoding/json")

// asksForInput reports whether raw, a result, may be of resultType "input_required": false
// only when a scan shows it is not; anything the scan leaves to encoding/json (or cannot read)
// may be.
func asksForInput(raw []byte) bool {
	may := false
	err := jsonscan.Members(raw, func(key []byte, escaped bool, val []byte) error {
		name, ok := jsonscan.ASCIIKey(key, escaped)
		switch {
		case !ok:
			return errLeaveToJSON
		case string(name) == "resultType":
			if bytes.IndexByte(val, '\\') >= 0 || string(val) == `"`+string(mcp.ResultTypeInputRequired)+`"` {
				may = true
			}
		case bytes.EqualFold(name, []byte("resultType")):
			return errLeaveToJSON // encoding/json would read it as resultType
		}
		return nil
	})
	return may || err != nil
}

// extraFields are the top-level fields of raw outside known and hopFields, as decoding raw
// into a map has them: a key with escapes or invalid UTF-8 (which decoding rewrites) has raw
// decoded.
func extraFields(raw []byte, known []string) (map[string]json.RawMessage, error) {
	var out map[string]json.RawMessage
	err := jsonscan.Members(raw, func(key []byte, escaped bool, val []byte) error {
		if escaped || !utf8.Valid(key) { // encoding/json replaces invalid UTF-8 in a key
			return errLeaveToJSON
		}
		name := string(key[1 : len(key)-1])
		if slices.Contains(known, name) || slices.Contains(hopFields, name) {
			return nil
		}
		if out == nil {
			out = map[string]json.RawMessage{}
		}
		out[name] = val
		return nil
	})
	if err == nil {
		return out, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, err
	}
	for _, k := range append(known, hopFields...) {
		delete(fields, k)
	}
	return fields, nil
}

// scanMessage reads a sandbox's JSON-RPC message as json.Unmarshal into rpcMessage would,
// in one scan that does not decode the params beyond their uri; ok is false when it leaves the
// message to encoding/json (a key it might read differently, a repeated member, a value of
// another type, a string with escapes or beyond ASCII, invalid JSON).
func scanMessage(body []byte) (msg rpcMessage, ok bool) {
	var seen [5]bool
	err := jsonscan.Members(body, func(key []byte, escaped bool, val []byte) error {
		name, ok := jsonscan.LowerKey(key, escaped)
		if !ok {
			return errLeaveToJSON
		}
		i := slices.Index(messageKeys, string(name))
		switch {
		case i < 0:
			return nil
		case seen[i] || string(val) == "null":
			return errLeaveToJSON
		}
		seen[i] = true
		switch name := string(name); name {
		case "method":
			s, ok := plainString(val)
			if !ok {
				return errLeaveToJSON
			}
			msg.Method = s
		case "id":
			msg.ID = json.RawMessage(val)
		case "result":
			msg.Result = json.RawMessage(val)
		case "error":
			msg.Error = json.RawMessage(val)
		case "params":
			uri, ok := scanURI(val)
			if !ok {
				return errLeaveToJSON
			}
			msg.Params.URI = uri
		}
		return nil
	})
	return msg, err == nil
}

var messageKeys = []string{"method", "id", "result", "error", "params"}

// scanURI is the uri member of params, an object.
func scanURI(params []byte) (string, bool) {
	var uri string
	seen := false
	s := jsonscan.New(params)
	err := s.Object(2, func(key []byte, escaped bool, val []byte) error {
		name, ok := jsonscan.LowerKey(key, escaped)
		switch {
		case !ok:
			return errLeaveToJSON
		case string(name) != "uri":
			return nil
		case seen:
			return errLeaveToJSON
		}
		seen = true
		if string(val) == "null" {
			return nil
		}
		var isString bool
		if uri, isString = plainString(val); !isString {
			return errLeaveToJSON
		}
		return nil
	})
	return uri, err == nil
}

// plainString is a raw JSON string value without its quotes, when it has no escapes and only
// ASCII (which encoding/json decodes to itself).
func plainString(val []byte) (string, bool) {
	if len(val) < 2 || val[0] != '"' || bytes.IndexByte(val, '\\') >= 0 {
		return "", false
	}
	for _, c := range val {
		if c >= 0x80 {
			return "", false
		}
	}
	return string(val[1 : len(val)-1]), true
}

// scanToolResult reads a tools/call result as json.Unmarshal into toolResultFields would, in
// one scan that keeps the content items raw; ok is false when it leaves the result to
// encoding/json (as scanMessage does).
func scanToolResult(raw []byte) (f toolResultFields, ok bool) {
	var seen [len(toolResultKeys)]bool
	err := jsonscan.Members(raw, func(key []byte, escaped bool, val []byte) error {
		name, ok := jsonscan.ASCIIKey(key, escaped)
		if !ok {
			return errLeaveToJSON
		}
		i := slices.Index(toolResultKeys[:], string(name))
		switch {
		case i < 0:
			if slices.ContainsFunc(toolResultKeys[:], func(k string) bool { return strings.EqualFold(k, string(name)) }) {
				return errLeaveToJSON // encoding/json would read it as that field
			}
			return nil
		case seen[i] || string(val) == "null":
			return errLeaveToJSON
		}
		seen[i] = true
		return f.set(i, val)
	})
	return f, err == nil
}

var toolResultKeys = [...]string{"content", "structuredContent", "isError", "_meta"}

// set reads member i of toolResultKeys from val.
func (f *toolResultFields) set(i int, val []byte) error {
	switch i {
	case 0:
		f.Content = []json.RawMessage{}
		s := jsonscan.New(val)
		return s.Array(2, func(item []byte) error {
			f.Content = append(f.Content, item)
			return nil
		})
	case 1:
		f.Structured = val
	case 2:
		switch string(val) {
		case "true":
			f.IsError = true
		case "false":
		default:
			return errLeaveToJSON
		}
	case 3:
		f.Meta = &mcp.Meta{}
		return f.Meta.UnmarshalJSON(val)
	}
	return nil
}
