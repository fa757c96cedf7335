package policy

import (
	"slices"
	"strconv"

	"github.com/open-policy-agent/opa/v1/ast"
)

// The decision cache's key is the text of each referenced part of the input followed by a NUL:
// a string quoted (strconv.Quote), any other value as OPA prints it (ast Value.String), an
// undefined part as "-". A value's text never is "-" alone and never holds a NUL, so the key
// is injective: two inputs get the same key exactly when every referenced part is equal.
//
// Building AST terms only to print them cost most of a cache hit (a term and a boxed string
// per field, an object per labels map), so each referenced path gets, at load and by the path
// alone, a renderer that appends that same text straight from the Input struct: the identity
// fields and labels, mcp upstream and tool, the http fields, usage, and string-keyed walks into
// the decoded JSON of arguments and grants. Paths it does not know (whole sections, keys that
// are not fields) keep the field-and-print route. Every renderer writes the bytes the AST
// would print, so which route a path takes never changes its key
// (TestCacheKeyMatchesASTRendering compares them on random inputs).

// keyPart is one referenced path and how to render it.
type keyPart struct {
	path inputPath
	op   renderOp
	// keys is the path after the op's fixed part: the label, the usage name, the keys into
	// arguments or grants.
	keys []string
}

// renderOp names a struct renderer. The renderers are cases of one switch, not functions in
// the part: the key buffer lives on the decider's stack and must not escape to an indirect call.
type renderOp uint8

const (
	renderField renderOp = iota // the field route: Input.field, then the value's text
	renderKind
	renderNamespace
	renderSandbox
	renderTemplate
	renderClaim
	renderSourceIP
	renderKnown
	renderLabels
	renderLabel
	renderUpstream
	renderTool
	renderArgument
	renderExists
	renderVisible
	renderMethod
	renderHost
	renderPort
	renderPath
	renderRoute
	renderModel
	renderMaxTokens
	renderStream
	renderUsage
	renderGrant
)

// fieldOps are the two-key paths whose renderer takes no further keys.
var fieldOps = map[[2]string]renderOp{
	{"identity", "namespace"}: renderNamespace, {"identity", "sandbox"}: renderSandbox,
	{"identity", "template"}: renderTemplate, {"identity", "claim"}: renderClaim,
	{"identity", "source_ip"}: renderSourceIP, {"identity", "known"}: renderKnown,
	{"identity", "labels"}: renderLabels, {"mcp", "upstream"}: renderUpstream, {"mcp", "tool"}: renderTool,
	{"mcp", "exists"}: renderExists, {"mcp", "visible"}: renderVisible,
	{"http", "method"}: renderMethod, {"http", "host"}: renderHost, {"http", "port"}: renderPort,
	{"http", "path"}: renderPath, {"http", "route"}: renderRoute, {"http", "model"}: renderModel,
	{"http", "max_tokens"}: renderMaxTokens, {"http", "stream"}: renderStream,
}

// keyParts chooses each path's renderer, by the path alone.
func keyParts(paths []inputPath) []keyPart {
	parts := make([]keyPart, len(paths))
	for i, p := range paths {
		parts[i] = keyPart{path: p}
		keys := make([]string, len(p))
		for j, t := range p {
			s, ok := t.Value.(ast.String)
			if !ok {
				keys = nil
				break
			}
			keys[j] = string(s)
		}
		switch {
		case len(keys) == 1 && keys[0] == "kind":
			parts[i].op = renderKind
		case len(keys) > 1 && keys[0] == "grants":
			parts[i].op, parts[i].keys = renderGrant, keys[1:]
		case len(keys) == 2 && keys[0] == "usage":
			parts[i].op, parts[i].keys = renderUsage, keys[1:]
		case len(keys) == 2:
			parts[i].op = fieldOps[[2]string{keys[0], keys[1]}] // renderField when not listed
		case len(keys) == 3 && keys[0] == "identity" && keys[1] == "labels":
			parts[i].op, parts[i].keys = renderLabel, keys[2:]
		case len(keys) > 2 && keys[0] == "mcp" && keys[1] == "arguments":
			parts[i].op, parts[i].keys = renderArgument, keys[2:]
		}
	}
	return parts
}

// key appends to b the referenced parts of in; ok is false when the key would be too large or
// a part cannot be converted (the caller then evaluates, and Value reports the error).
func (c *decisionCache) key(b []byte, in *Input) ([]byte, bool) {
	for i := range c.parts {
		p := &c.parts[i]
		n := len(b)
		var ok bool
		if b, ok = p.render(b, in); !ok {
			v, err := in.field(p.path)
			if err != nil {
				return b[:n], false
			}
			b = appendValueText(b[:n], v)
		}
		b = append(b, 0)
		if len(b) > maxCacheKeyBytes {
			return b, false
		}
	}
	return b, true
}

// quote is strconv.AppendQuote(b, s) without its rune-by-rune escaping when s is printable
// ASCII with no quote or backslash, as nearly every key part is (the fast path took about
// 1 µs of a routed request's decision in a bench profile; FuzzQuote holds it to strconv).
func quote(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' || c > '~' || c == '"' || c == '\\' {
			return strconv.AppendQuote(b, s)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendValueText appends v as the key prints it: "-" for undefined, else OPA's text of v. Not
// through the value's AppendText: a call through an interface would move the key buffer to
// the heap on every decision, not only on this route.
func appendValueText(b []byte, v ast.Value) []byte {
	switch v := v.(type) {
	case nil:
		return append(b, '-')
	case ast.String:
		return quote(b, string(v))
	}
	return append(b, v.String()...)
}

// render appends the part's text straight from in, "-" when undefined; ok is false for the
// field route, and for JSON that only the AST prints (the caller drops what was appended).
func (p *keyPart) render(b []byte, in *Input) ([]byte, bool) {
	id, m, h := &in.Identity, in.MCP, in.HTTP
	switch p.op {
	case renderKind:
		return quote(b, string(in.Kind)), true
	case renderNamespace:
		return quote(b, id.Namespace), true
	case renderSandbox:
		return quote(b, id.Sandbox), true
	case renderTemplate:
		return quote(b, id.Template), true
	case renderClaim:
		return quote(b, id.Claim), true
	case renderSourceIP:
		return quote(b, id.SourceIP), true
	case renderKnown:
		return strconv.AppendBool(b, id.Known), true
	case renderLabels:
		return appendLabels(b, id.Labels), true
	case renderLabel:
		v, found := id.Labels[p.keys[0]]
		if !found {
			return append(b, '-'), true
		}
		return quote(b, v), true
	case renderUsage:
		v, found := in.Usage[p.keys[0]]
		if !found {
			return append(b, '-'), true
		}
		return strconv.AppendInt(b, int64(int(v)), 10), true
	case renderGrant:
		return appendJSONAt(b, in.Grants, p.keys)
	case renderField:
		return b, false
	case renderUpstream, renderTool, renderArgument, renderExists, renderVisible:
		if m == nil {
			return append(b, '-'), true
		}
		return p.renderMCP(b, m)
	default: // the http fields
		if h == nil {
			return append(b, '-'), true
		}
		return p.renderHTTP(b, h), true
	}
}

func (p *keyPart) renderMCP(b []byte, m *MCP) ([]byte, bool) {
	switch p.op {
	case renderUpstream:
		return quote(b, m.Upstream), true
	case renderTool:
		return quote(b, m.Tool), true
	case renderArgument:
		return appendJSONAt(b, m.Arguments, p.keys)
	case renderExists:
		return strconv.AppendBool(b, !m.NotFound), true
	case renderVisible:
		return strconv.AppendBool(b, !m.Hidden), true
	}
	return b, false
}

func (p *keyPart) renderHTTP(b []byte, h *HTTP) []byte {
	switch p.op {
	case renderMethod:
		return quote(b, h.Method)
	case renderHost:
		return quote(b, h.Host)
	case renderPort:
		return strconv.AppendInt(b, int64(h.Port), 10)
	case renderPath:
		return quote(b, h.Path)
	case renderRoute:
		return quote(b, h.Route)
	case renderModel:
		return quote(b, h.Model)
	case renderMaxTokens:
		return strconv.AppendInt(b, int64(int(h.MaxTokens)), 10)
	}
	return strconv.AppendBool(b, h.Stream) // renderStream
}

// appendLabels prints the labels as OPA prints the object Value builds from them: keys in
// order, `{"k": "v", "k2": "v2"}`, `{}` when there are none.
func appendLabels(b []byte, labels map[string]string) []byte {
	var small [16]string
	keys := small[:0]
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = quote(b, k)
		b = append(b, ": "...)
		b = quote(b, labels[k])
	}
	return append(b, '}')
}

// appendJSONAt walks decoded JSON objects along keys (as jsonField does) and prints what it
// finds; ok is false for anything but decoded-JSON objects on the way and strings, booleans,
// null and arrays of them at the end, which the field route converts and prints instead.
func appendJSONAt(b []byte, m map[string]any, keys []string) ([]byte, bool) {
	var v any = m
	for _, k := range keys {
		obj, isObj := v.(map[string]any)
		if !isObj {
			return b, false
		}
		var found bool
		if v, found = obj[k]; !found {
			return append(b, '-'), true
		}
	}
	return appendJSONScalars(b, v)
}

func appendJSONScalars(b []byte, v any) ([]byte, bool) {
	switch v := v.(type) {
	case string:
		return quote(b, v), true
	case bool:
		return strconv.AppendBool(b, v), true
	case nil:
		return append(b, "null"...), true
	case []any:
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ", "...)
			}
			var ok bool
			if b, ok = appendJSONScalars(b, e); !ok {
				return b, false
			}
		}
		return append(b, ']'), true
	}
	return b, false
}
