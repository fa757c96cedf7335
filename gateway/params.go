package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

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
func policyArguments(req mcp.CallToolRequest) (map[string]any, error) {
	raw := req.Params.RawArguments
	if len(raw) == 0 || string(raw) == "null" {
		return req.GetArguments(), nil
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var args map[string]any
	if err := d.Decode(&args); err != nil {
		return nil, fmt.Errorf("tools/call arguments: %w", err)
	}
	return args, nil
}
