package policy

import (
	"slices"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
)

// The logged document's nodes, as the event encoder walks them: the input is the document
// Input.Value builds, read from the Input's fields instead of an ast.Value; decoded JSON
// (arguments, grants) is walked as it is. A node is a scalar, []any, map[string]any, or one of
// the types below; child and keysOf describe the objects, keys sorted as encoding/json sorts a
// map's.

// kindOnly is the input logged for a call whose input JSON cannot carry (Input.Value failed).
type kindOnly struct{ kind audit.Kind }

var (
	inputKeysMCP     = []string{"grants", "identity", "kind", "mcp", "usage"}
	inputKeysHTTP    = []string{"grants", "http", "identity", "kind", "usage"}
	inputKeysBoth    = []string{"grants", "http", "identity", "kind", "mcp", "usage"}
	inputKeysNeither = []string{"grants", "identity", "kind", "usage"}
	identityNames    = []string{"claim", "known", "labels", "namespace", "sandbox", "source_ip", "template"}
	mcpNames         = []string{"arguments", "exists", "tool", "upstream", "visible"}
	httpNames        = []string{"host", "max_tokens", "method", "model", "path", "port", "route", "stream"}
	resultKeys       = []string{"allow", "code", "reason"}
	resultKeysCred   = []string{"allow", "code", "credential", "reason"}
	resultKeysReport = []string{"allow", "code", "enforce", "reason"}
	kindKeys         = []string{"kind"}
)

// keysOf lists an object node's keys, sorted; a map's are appended to e.keys (the caller
// truncates it after use). Not an object: nil.
func (e *eventEncoder) keysOf(node any) []string {
	switch n := node.(type) {
	case *Input:
		keys := inputKeysNeither
		switch {
		case n.MCP != nil && n.HTTP != nil:
			keys = inputKeysBoth
		case n.MCP != nil:
			keys = inputKeysMCP
		case n.HTTP != nil:
			keys = inputKeysHTTP
		}
		if n.Credential != nil { // "credential" sorts first
			start := len(e.keys)
			e.keys = append(append(e.keys, "credential"), keys...)
			return e.keys[start:]
		}
		return keys
	case kindOnly:
		return kindKeys
	case *identity.Identity:
		return identityNames
	case *MCP:
		return mcpNames
	case *HTTP:
		return httpNames
	case *Decision:
		switch {
		case n.Credential != "":
			return resultKeysCred // a report-only decision is a denial: it names no credential
		case n.ReportOnly:
			return resultKeysReport
		}
		return resultKeys
	case map[string]string:
		return e.sortKeys(n)
	case map[string]int64:
		return e.sortKeys(n)
	case map[string]any:
		return e.sortKeys(n)
	}
	return nil
}

func sortKeysInto[V any](keys []string, m map[string]V) []string {
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

func (e *eventEncoder) sortKeys(m any) []string {
	n := len(e.keys)
	switch m := m.(type) {
	case map[string]string:
		e.keys = sortKeysInto(e.keys, m)
	case map[string]int64:
		e.keys = sortKeysInto(e.keys, m)
	case map[string]any:
		e.keys = sortKeysInto(e.keys, m)
	}
	keys := e.keys[n:]
	slices.Sort(keys)
	return keys
}

// child is the member k of an object node.
func child(node any, k string) (any, bool) {
	switch n := node.(type) {
	case *Input:
		return inputChild(n, k)
	case kindOnly:
		return string(n.kind), k == "kind"
	case *identity.Identity:
		return identityChild(n, k)
	case *MCP:
		switch k {
		case "arguments":
			return n.Arguments, true
		case "tool":
			return n.Tool, true
		case "upstream":
			return n.Upstream, true
		case "exists":
			return !n.NotFound, true
		case "visible":
			return !n.Hidden, true
		}
	case *HTTP:
		return httpChild(n, k)
	case *Decision:
		return resultChild(n, k)
	case map[string]string:
		v, ok := n[k]
		return v, ok
	case map[string]int64:
		v, ok := n[k]
		return v, ok
	case map[string]any:
		v, ok := n[k]
		return normalize(v), ok
	}
	return nil, false
}

func inputChild(in *Input, k string) (any, bool) {
	switch k {
	case "credential":
		if in.Credential == nil {
			return nil, false
		}
		return in.Credential.document(), true
	case "grants":
		return in.Grants, true
	case "identity":
		return &in.Identity, true
	case "kind":
		return string(in.Kind), true
	case "usage":
		return in.Usage, true
	case "mcp":
		return in.MCP, in.MCP != nil
	case "http":
		return in.HTTP, in.HTTP != nil
	}
	return nil, false
}

func identityChild(id *identity.Identity, k string) (any, bool) {
	switch k {
	case "claim":
		return id.Claim, true
	case "known":
		return id.Known, true
	case "labels":
		return id.Labels, true
	case "namespace":
		return id.Namespace, true
	case "sandbox":
		return id.Sandbox, true
	case "source_ip":
		return id.SourceIP, true
	case "template":
		return id.Template, true
	}
	return nil, false
}

func httpChild(h *HTTP, k string) (any, bool) {
	switch k {
	case "host":
		return h.Host, true
	case "max_tokens":
		return h.MaxTokens, true
	case "method":
		return h.Method, true
	case "model":
		return h.Model, true
	case "path":
		return h.Path, true
	case "port":
		return h.Port, true
	case "route":
		return h.Route, true
	case "stream":
		return h.Stream, true
	}
	return nil, false
}

func resultChild(d *Decision, k string) (any, bool) {
	switch k {
	case "allow":
		return d.Allow, true
	case "code":
		return d.Code, true
	case "credential":
		return d.Credential, d.Credential != ""
	case "enforce":
		return false, d.ReportOnly
	case "reason":
		return d.Reason, true
	}
	return nil, false
}

// The structured nodes' members written directly, keys in the order keysOf lists them.

func (e *eventEncoder) input(b []byte, in *Input, rel []int, d int) ([]byte, error) {
	b, first := append(b, '{'), true
	var err error
	if in.Credential != nil {
		if b, err = e.field(b, true, "credential", in.Credential.document(), rel, d); err != nil {
			return b, err
		}
		first = false
	}
	if b, err = e.field(b, first, "grants", in.Grants, rel, d); err != nil {
		return b, err
	}
	if in.HTTP != nil {
		b, _ = e.field(b, false, "http", in.HTTP, rel, d)
	}
	b, _ = e.field(b, false, "identity", &in.Identity, rel, d)
	b = e.str(b, false, "kind", string(in.Kind), rel, d)
	if in.MCP != nil {
		if b, err = e.field(b, false, "mcp", in.MCP, rel, d); err != nil {
			return b, err
		}
	}
	b, _ = e.field(b, false, "usage", in.Usage, rel, d)
	return append(b, '}'), nil
}

func (e *eventEncoder) identity(b []byte, id *identity.Identity, rel []int, d int) []byte {
	b = e.str(append(b, '{'), true, "claim", id.Claim, rel, d)
	b = e.boolean(b, false, "known", id.Known, rel, d)
	b, _ = e.field(b, false, "labels", id.Labels, rel, d)
	b = e.str(b, false, "namespace", id.Namespace, rel, d)
	b = e.str(b, false, "sandbox", id.Sandbox, rel, d)
	b = e.str(b, false, "source_ip", id.SourceIP, rel, d)
	b = e.str(b, false, "template", id.Template, rel, d)
	return append(b, '}')
}

func (e *eventEncoder) mcp(b []byte, m *MCP, rel []int, d int) ([]byte, error) {
	b, err := e.field(append(b, '{'), true, "arguments", m.Arguments, rel, d)
	if err != nil {
		return b, err
	}
	b = e.boolean(b, false, "exists", !m.NotFound, rel, d)
	b = e.str(b, false, "tool", m.Tool, rel, d)
	b = e.str(b, false, "upstream", m.Upstream, rel, d)
	b = e.boolean(b, false, "visible", !m.Hidden, rel, d)
	return append(b, '}'), nil
}

func (e *eventEncoder) http(b []byte, h *HTTP, rel []int, d int) []byte {
	b = e.str(append(b, '{'), true, "host", h.Host, rel, d)
	b = e.integer(b, "max_tokens", h.MaxTokens, rel, d)
	b = e.str(b, false, "method", h.Method, rel, d)
	b = e.str(b, false, "model", h.Model, rel, d)
	b = e.str(b, false, "path", h.Path, rel, d)
	b = e.integer(b, "port", int64(h.Port), rel, d)
	b = e.str(b, false, "route", h.Route, rel, d)
	b = e.boolean(b, false, "stream", h.Stream, rel, d)
	return append(b, '}')
}

func (e *eventEncoder) result(b []byte, r *Decision, rel []int, d int) []byte {
	b = e.boolean(append(b, '{'), true, "allow", r.Allow, rel, d)
	b = e.str(b, false, "code", r.Code, rel, d)
	if r.Credential != "" {
		b = e.str(b, false, "credential", r.Credential, rel, d)
	} else if r.ReportOnly {
		b = e.boolean(b, false, "enforce", false, rel, d)
	}
	b = e.str(b, false, "reason", r.Reason, rel, d)
	return append(b, '}')
}
