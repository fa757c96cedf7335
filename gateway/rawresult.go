package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/internal/jsonscan"
)

// A tools/call result reaches a sandbox as the upstream wrote it. The handler hands mcp-go a
// stand-in result (no content, the upstream's isError) and keeps the upstream's bytes on the
// request (resultExtras.result); the guard's writer then writes those bytes as the result of
// the response mcp-go wrote, adding only what mcp-go's result has that the upstream's has not
// (the revision's resultType, say). The bytes are never decoded: the typed round trip decoded
// and re-encoded every content item, which cost more than the rest of Sandgate's own work on a
// call and respelled what it did not drop (numbers, escapes). A call served without the guard
// (in-process, stdio) gets the typed result (parseToolResult).

// verbatimResult is an upstream's result object, its hop fields (resultType and the multi
// round-trip fields) removed: its members as written, comma-separated, without the braces.
type verbatimResult struct {
	members []byte
	keys    []string
}

// toolResultFor is the parse function of a tools/call forwarded for the request of ctx.
func toolResultFor(ctx context.Context) func(*json.RawMessage) (*mcp.CallToolResult, error) {
	e, ok := ctx.Value(extrasKey{}).(*resultExtras)
	if !ok {
		return parseToolResult
	}
	return func(raw *json.RawMessage) (*mcp.CallToolResult, error) {
		f, ok := scanToolResult(*raw)
		if !ok {
			f = toolResultFields{}
			if err := json.Unmarshal(*raw, &f); err != nil {
				return nil, errors.New("decode tools/call result: " + err.Error())
			}
		}
		if f.Content == nil {
			return nil, errors.New("tools/call result has no content")
		}
		vr, err := verbatimOf(*raw)
		if err != nil {
			return parseToolResult(raw)
		}
		e.mu.Lock()
		e.result = vr
		e.mu.Unlock()
		return &mcp.CallToolResult{Content: []mcp.Content{}, IsError: f.IsError}, nil
	}
}

// keptWhole is parse, the decoding of a result for mcp-go, also keeping the result verbatim for
// the response's writer when the request has one (withExtras): the sandbox reads the upstream's
// bytes, not mcp-go's encoding of the typed result.
func keptWhole[R any](ctx context.Context, parse func(*json.RawMessage) (R, error)) func(*json.RawMessage) (R, error) {
	e, ok := ctx.Value(extrasKey{}).(*resultExtras)
	if !ok {
		return parse
	}
	return func(raw *json.RawMessage) (R, error) {
		r, err := parse(raw)
		if err != nil {
			return r, err
		}
		if vr, err := verbatimOf(*raw); err == nil {
			e.mu.Lock()
			e.result = vr
			e.mu.Unlock()
		}
		return r, nil
	}
}

// verbatimOf is raw, an object, without its hop fields.
func verbatimOf(raw []byte) (*verbatimResult, error) {
	vr := &verbatimResult{members: make([]byte, 0, len(raw))}
	err := jsonscan.Members(raw, func(key []byte, escaped bool, val []byte) error {
		name, err := keyName(key, escaped)
		if err != nil {
			return err
		}
		if slices.Contains(hopFields, name) {
			return nil
		}
		if name == "_meta" && len(val) > 0 && val[0] == '{' {
			if val, err = withoutProtocolMeta(val); err != nil || val == nil {
				return err
			}
		}
		if len(vr.keys) > 0 {
			vr.members = append(vr.members, ',')
		}
		vr.members = append(append(append(vr.members, key...), ':'), val...)
		vr.keys = append(vr.keys, name)
		return nil
	})
	return vr, err
}

// withoutProtocolMeta is meta, a result's _meta, without the protocol's own
// "io.modelcontextprotocol/" keys, which describe the upstream's hop (a 2026-07-28 server's
// serverInfo), as they are stripped from requests (upstreamMeta); nil when nothing is left of a
// _meta that held only those.
func withoutProtocolMeta(meta []byte) ([]byte, error) {
	out := make([]byte, 0, len(meta))
	out = append(out, '{')
	kept, dropped := 0, 0
	err := jsonscan.Members(meta, func(key []byte, escaped bool, val []byte) error {
		name, err := keyName(key, escaped)
		if err != nil {
			return err
		}
		if strings.HasPrefix(name, protocolMetaPrefix) {
			dropped++
			return nil
		}
		if kept > 0 {
			out = append(out, ',')
		}
		kept++
		out = append(append(append(out, key...), ':'), val...)
		return nil
	})
	switch {
	case err != nil:
		return nil, err
	case dropped == 0:
		return meta, nil
	case kept == 0:
		return nil, nil
	}
	return append(out, '}'), nil
}

// keyName is the name a raw key (quotes included) stands for.
func keyName(key []byte, escaped bool) (string, error) {
	if !escaped {
		return string(key[1 : len(key)-1]), nil
	}
	var s string
	err := json.Unmarshal(key, &s)
	return s, err
}

// withVerbatimResult is msg, mcp-go's response to request id, with vr as its result plus the
// members of mcp-go's result that vr lacks; errNotAList when msg is another message.
func withVerbatimResult(msg []byte, id json.RawMessage, vr *verbatimResult) ([]byte, error) {
	type member struct{ key, val []byte }
	var members []member
	var gotID, result []byte
	at := -1
	err := jsonscan.Members(msg, func(key []byte, escaped bool, val []byte) error {
		name, err := keyName(key, escaped)
		switch {
		case err != nil:
			return err
		case name == "id":
			gotID = val
		case name == "result":
			result, at = val, len(members)
		}
		members = append(members, member{key, val})
		return nil
	})
	if err != nil || result == nil || !sameID(gotID, id) {
		return nil, errNotAList
	}
	out := make([]byte, 0, len(msg)+len(vr.members))
	out = append(out, '{')
	for i, m := range members {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(append(out, m.key...), ':')
		if i != at {
			out = append(out, m.val...)
			continue
		}
		if out, err = appendMerged(out, vr, result); err != nil {
			return nil, err
		}
	}
	return append(out, '}'), nil
}

// appendMerged appends vr's members and those of typed, mcp-go's result object, that vr lacks.
func appendMerged(out []byte, vr *verbatimResult, typed []byte) ([]byte, error) {
	out = append(append(out, '{'), vr.members...)
	n := len(vr.keys)
	err := jsonscan.Members(typed, func(key []byte, escaped bool, val []byte) error {
		name, err := keyName(key, escaped)
		if err != nil || slices.Contains(vr.keys, name) {
			return err
		}
		if n > 0 {
			out = append(out, ',')
		}
		n++
		out = append(append(append(out, key...), ':'), val...)
		return nil
	})
	return append(out, '}'), err
}

// sameID reports whether two JSON-RPC ids are the same value (1 and 1.0, "a" and "\u0061").
func sameID(a, b []byte) bool {
	a, b = bytes.TrimSpace(a), bytes.TrimSpace(b)
	if bytes.Equal(a, b) {
		return len(a) > 0
	}
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && x != nil && reflect.DeepEqual(x, y)
}
