package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/internal/jsonenc"
)

// eventEncoder writes one decision as a line of OPA's decision-log event (logs.EventV1) straight
// into a byte slice: no intermediate map, no ast.Value, no json.Marshal, and the masks applied
// while writing. The generic path (Input.Value, ast.JSON, EventV1 maps masked, json.Marshal)
// cost 20–47 µs per event, so the writer could not keep up with cached decisions and dropped
// three in four of them; this one costs ~1 µs (BenchmarkEventEncoder).
// BenchmarkCallDecision, cpu-ns/op medians, -count 8 interleaved with the former build
// (2-core shared box), log on / log off:
//
//	evaluated (cache=false): 1.01× (0.90–1.20), was 1.27× (1.23–1.48)
//	cached (cache=true):     1.38× (1.19–1.46), none dropped; was 2.23× with 75% dropped
//
// The cached decision step is ~4 µs, so its ~1.5 µs more stays above 1.10×; a route or mcp
// request (100–250 µs of CPU) is within the noise (sandbench -workloads declog).
// TestEventEncoderMatchesTheGenericPath holds it to the value the generic path produces (kept in
// the test as referenceEvent), and FuzzEventEncoder to valid JSON and the same value.
//
// The output is what json.Marshal writes for the same event, except that HTML characters are
// not escaped (both decode to the same value) and floats use encoding/json's formatting
// rather than OPA's %g.
//
// It is used by the decision log's single writer goroutine; its scratch is reused per event.
type eventEncoder struct {
	masks  []maskPointer
	labels []byte // the labels member's value, encoded once
	hit    []bool // per mask: did it replace anything in this event
	stack  []int  // the masks relevant below each node on the current path
	keys   []string
}

func newEventEncoder(masks []maskPointer, labels map[string]string) *eventEncoder {
	e := &eventEncoder{masks: masks, hit: make([]bool, len(masks))}
	e.labels = jsonenc.AppendStringMap(nil, labels)
	return e
}

// errNotJSON is an input value that JSON cannot carry (a NaN, a channel, an invalid
// json.Number); the engine refused such an input for the same reason.
var errNotJSON = errors.New("not a JSON value")

// encode appends item's event and a newline to b.
func (e *eventEncoder) encode(b []byte, item *loggedDecision) []byte {
	in := &item.in
	e.stack = e.stack[:0]
	b = append(b, `{"labels":`...)
	b = append(b, e.labels...)
	b = append(b, `,"decision_id":`...)
	b = jsonenc.AppendString(b, item.id)
	b = append(b, `,"bundles":{"sandgate":{`...)
	if item.d.Revision != "" {
		b = append(b, `"revision":`...)
		b = jsonenc.AppendString(b, item.d.Revision)
	}
	b = append(b, `}}`...)
	if item.path != "" {
		b = append(b, `,"path":`...)
		b = jsonenc.AppendString(b, item.path)
	}
	b = append(b, `,"input":`...)
	e.findHits(in, &item.d)
	n := len(b)
	b, err := e.value(b, in, e.relevant("input"), 0)
	if err != nil {
		// The engine denied this call for the same reason; log what can be logged.
		e.findHits(kindOnly{in.Kind}, &item.d)
		b, _ = e.value(b[:n], kindOnly{in.Kind}, e.relevant("input"), 0)
	}
	b = append(b, `,"result":`...)
	b, _ = e.value(b, &item.d, e.relevant("result"), 0)
	if slices.Contains(e.hit, true) {
		b = append(b, `,"masked":[`...)
		first := true
		for i, m := range e.masks {
			if e.hit[i] {
				if !first {
					b = append(b, ',')
				}
				first = false
				b = jsonenc.AppendString(b, m.raw)
			}
		}
		b = append(b, ']')
	}
	b = append(b, `,"timestamp":"`...)
	b = item.at.UTC().AppendFormat(b, time.RFC3339Nano)
	return append(b, "\"}\n"...)
}

// relevant pushes the masks hitting under root and returns them.
func (e *eventEncoder) relevant(root string) []int {
	n := len(e.stack)
	for i, m := range e.masks {
		if e.hit[i] && m.root == root {
			e.stack = append(e.stack, i)
		}
	}
	return e.stack[n:]
}

// member writes one object member, key and value, at depth d below the document root: the
// value is MaskedValue when a hitting mask names it, else v with the masks that reach below.
func (e *eventEncoder) member(b []byte, first bool, key string, v any, rel []int, d int) ([]byte, error) {
	b = jsonenc.AppendString(comma(b, first), key)
	return e.memberValue(append(b, ':'), key, v, rel, d)
}

// field is member for a key of the document's own layout: plain ASCII, written unescaped.
func (e *eventEncoder) field(b []byte, first bool, key string, v any, rel []int, d int) ([]byte, error) {
	return e.memberValue(appendKey(b, first, key), key, v, rel, d)
}

func (e *eventEncoder) memberValue(b []byte, key string, v any, rel []int, d int) ([]byte, error) {
	masked, below := e.enter(rel, d, key)
	if masked {
		return jsonenc.AppendString(b, MaskedValue), nil
	}
	return e.value(b, v, below, d+1)
}

// str, boolean and integer write a scalar field as field does, without boxing it.
func (e *eventEncoder) str(b []byte, first bool, key, s string, rel []int, d int) []byte {
	b = appendKey(b, first, key)
	if masked, _ := e.enter(rel, d, key); masked {
		s = MaskedValue
	}
	return jsonenc.AppendString(b, s)
}

func (e *eventEncoder) boolean(b []byte, first bool, key string, v bool, rel []int, d int) []byte {
	b = appendKey(b, first, key)
	if masked, _ := e.enter(rel, d, key); masked {
		return jsonenc.AppendString(b, MaskedValue)
	}
	return strconv.AppendBool(b, v)
}

func (e *eventEncoder) integer(b []byte, key string, v int64, rel []int, d int) []byte {
	b = appendKey(b, false, key)
	if masked, _ := e.enter(rel, d, key); masked {
		return jsonenc.AppendString(b, MaskedValue)
	}
	return strconv.AppendInt(b, v, 10)
}

func comma(b []byte, first bool) []byte {
	if first {
		return b
	}
	return append(b, ',')
}

// appendKey writes a key of the document's layout (plain ASCII: nothing to escape) and colon.
func appendKey(b []byte, first bool, key string) []byte {
	b = append(comma(b, first), '"')
	b = append(b, key...)
	return append(b, '"', ':')
}

// enter reports whether a hitting mask names member key at depth d, else returns the masks
// that reach below it (pushed on e.stack, which encode resets).
func (e *eventEncoder) enter(rel []int, d int, key string) (bool, []int) {
	if len(rel) == 0 {
		return false, nil
	}
	n := len(e.stack)
	for _, i := range rel {
		p := e.masks[i].path
		last := len(p) - 1
		switch {
		case d == last && (p[d] == key || p[d] == "*"):
			e.stack = e.stack[:n]
			return true, nil
		case d < last && p[d] == key:
			e.stack = append(e.stack, i)
		}
	}
	return false, e.stack[n:]
}

// value writes v, a node of the logged document (see child for the node types).
func (e *eventEncoder) value(b []byte, v any, rel []int, d int) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case string:
		return jsonenc.AppendString(b, v), nil
	case bool:
		return strconv.AppendBool(b, v), nil
	case int:
		return strconv.AppendInt(b, int64(v), 10), nil
	case int64:
		return strconv.AppendInt(b, v, 10), nil
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return b, errNotJSON
		}
		return jsonenc.AppendFloat(b, v), nil
	case json.Number:
		if !jsonenc.ValidNumber(string(v)) {
			return b, errNotJSON
		}
		return append(b, v...), nil
	case []any:
		return e.array(b, v, rel, d)
	case *Input:
		return e.input(b, v, rel, d)
	case *identity.Identity:
		return e.identity(b, v, rel, d), nil
	case *MCP:
		return e.mcp(b, v, rel, d)
	case *HTTP:
		return e.http(b, v, rel, d), nil
	case *Decision:
		return e.result(b, v, rel, d), nil
	case kindOnly, map[string]string, map[string]int64, map[string]any:
		return e.object(b, v, rel, d)
	}
	return b, errNotJSON
}

// object writes an object node, members in key order.
func (e *eventEncoder) object(b []byte, v any, rel []int, d int) ([]byte, error) {
	n := len(e.keys)
	keys := e.keysOf(v)
	b = append(b, '{')
	var err error
	for i, k := range keys {
		c, _ := child(v, k)
		if b, err = e.member(b, i == 0, k, c, rel, d); err != nil {
			break
		}
	}
	e.keys = e.keys[:n]
	return append(b, '}'), err
}

func (e *eventEncoder) array(b []byte, a []any, rel []int, d int) ([]byte, error) {
	masked := false
	for _, i := range rel {
		p := e.masks[i].path
		masked = masked || (d == len(p)-1 && p[d] == "*")
	}
	b = append(b, '[')
	var err error
	for i, v := range a {
		if i > 0 {
			b = append(b, ',')
		}
		if masked {
			b = jsonenc.AppendString(b, MaskedValue)
		} else if b, err = e.value(b, normalize(v), nil, d+1); err != nil {
			return b, err
		}
	}
	return append(b, ']'), nil
}

// findHits sets e.hit as OPA applies masks: in order, each replacing what its pointer names in
// the document the earlier ones left, so a mask below a value an earlier one replaced misses.
func (e *eventEncoder) findHits(input any, d *Decision) {
	for i, m := range e.masks {
		e.hit[i] = false
		shadowed := false
		for j := range i {
			shadowed = shadowed || (e.hit[j] && replacesParentOf(e.masks[j], m))
		}
		if shadowed {
			continue
		}
		node := input
		if m.root == "result" {
			node = d
		}
		e.hit[i] = e.hits(node, m.path)
	}
}

// replacesParentOf: a value j replaces is the parent of i's target or above it.
func replacesParentOf(j, i maskPointer) bool {
	if j.root != i.root {
		return false
	}
	jl, il := len(j.path)-1, len(i.path)-1
	if j.path[jl] == "*" { // replaces every child of j's parent
		return jl < il && slices.Equal(j.path[:jl], i.path[:jl])
	}
	return jl < il && slices.Equal(j.path, i.path[:jl+1])
}

// hits reports whether path names a value below node: through objects, a last "*" naming the
// members or elements of a non-empty object or array.
func (e *eventEncoder) hits(node any, path []string) bool {
	last := len(path) - 1
	for _, k := range path[:last] {
		var ok bool
		if node, ok = child(node, k); !ok {
			return false
		}
	}
	switch n := node.(type) {
	case []any:
		return path[last] == "*" && len(n) > 0
	case nil, string, bool, int, int64, float64, json.Number, notJSON:
		return false
	}
	if path[last] == "*" {
		switch n := node.(type) {
		case map[string]any:
			return len(n) > 0
		case map[string]string:
			return len(n) > 0
		case map[string]int64:
			return len(n) > 0
		}
		return len(e.keysOf(node)) > 0 // a node of the layout: no map to list
	}
	_, ok := child(node, path[last])
	return ok
}

// normalize gives a decoded-JSON value one of the types value writes; anything else is
// converted through encoding/json, as ast.InterfaceToValue does (nil on failure, see value).
func normalize(v any) any {
	switch v := v.(type) {
	case nil, string, bool, int, int64, float64, json.Number, []any, map[string]any:
		return v
	case float32:
		return float64(v)
	case int32:
		return int64(v)
	case uint64:
		return json.Number(strconv.FormatUint(v, 10))
	case uint:
		return json.Number(strconv.FormatUint(uint64(v), 10))
	case []string:
		a := make([]any, len(v))
		for i, s := range v {
			a[i] = s
		}
		return a
	case map[string]string, map[string]int64:
		return v
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return notJSON{fmt.Errorf("%T: %w", v, err)}
	}
	var out any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&out); err != nil {
		return notJSON{err}
	}
	return out
}

// notJSON stands for a value normalize could not convert; writing it fails.
type notJSON struct{ err error }
