package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
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

// plainASCIIKey is a raw key (quotes included) as the name it stands for, when it has no
// escapes and only ASCII letters.
func plainASCIIKey(key []byte, escaped bool) ([]byte, bool) {
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

// asksForInput reports whether raw, a result, may be of resultType "input_required": false
// only when a scan shows it is not; anything the scan leaves to encoding/json (or cannot read)
// may be.
func asksForInput(raw []byte) bool {
	may := false
	err := jsonscan.Members(raw, func(key []byte, escaped bool, val []byte) error {
		name, ok := plainASCIIKey(key, escaped)
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
