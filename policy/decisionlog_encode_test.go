package policy

import (
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/plugins/logs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
)

// referenceEvent is the decision log's former, generic path, kept as the reference the direct
// encoder is held to: the input as Input.Value builds it, converted by ast.JSON, put in OPA's
// EventV1, masked on the maps and encoded by json.Marshal.
func referenceEvent(t testing.TB, masks []maskPointer, labels map[string]string, item *loggedDecision) ([]byte, error) {
	t.Helper()
	val, err := item.in.Value()
	if err != nil {
		val = ast.NewObject(ast.Item(kKind, ast.StringTerm(string(item.in.Kind))))
	}
	input, err := ast.JSON(val)
	if err != nil {
		return nil, err
	}
	result := ResultDocument(item.d)
	ev := &logs.EventV1{
		Labels: labels, DecisionID: item.id, Path: item.path, Input: &input, Result: &result,
		Bundles:   map[string]logs.BundleInfoV1{BundleName: {Revision: item.d.Revision}},
		Timestamp: item.at.UTC(),
	}
	for _, m := range masks {
		if referenceMask(m, ev) {
			ev.Masked = append(ev.Masked, m.raw)
		}
	}
	return json.Marshal(ev)
}

// referenceMask is the former maskPointer.apply: m applied to the decoded document.
func referenceMask(m maskPointer, ev *logs.EventV1) bool {
	doc := ev.Input
	if m.root == "result" {
		doc = ev.Result
	}
	node := *doc
	last := len(m.path) - 1
	for _, k := range m.path[:last] {
		obj, ok := node.(map[string]any)
		if !ok {
			return false
		}
		if node, ok = obj[k]; !ok {
			return false
		}
	}
	masked := false
	switch obj := node.(type) {
	case map[string]any:
		if m.path[last] == "*" {
			for k := range obj {
				obj[k], masked = MaskedValue, true
			}
		} else if _, ok := obj[m.path[last]]; ok {
			obj[m.path[last]], masked = MaskedValue, true
		}
	case []any:
		if m.path[last] == "*" {
			for i := range obj {
				obj[i], masked = MaskedValue, true
			}
		}
	}
	return masked
}

func parseMasks(t testing.TB, raw []string) []maskPointer {
	t.Helper()
	masks := make([]maskPointer, len(raw))
	for i, p := range raw {
		m, err := parseMask(p)
		require.NoError(t, err)
		masks[i] = m
	}
	return masks
}

// decoded is b as a generic JSON value; it fails the test when b is not one JSON document.
func decoded(t testing.TB, b []byte) any {
	t.Helper()
	var v any
	require.NoError(t, json.Unmarshal(b, &v), "%s", b)
	return v
}

func mcpCall(args map[string]any) Input {
	return Input{Kind: audit.KindToolsCall,
		Identity: identity.Identity{Namespace: "team-a", Sandbox: "sb-1", Template: "coder", Claim: "c-1",
			Labels: map[string]string{"team": "a", "tier": "gold"}, SourceIP: "127.0.0.2", Known: true},
		MCP: &MCP{Upstream: "github", Tool: "create_issue", Arguments: args}}
}

func nestedArgs() map[string]any {
	return map[string]any{"token": "s3cret", "title": "hello", "page": 3, "ratio": 0.25, "big": 1e21, "tiny": 1e-7,
		"n": json.Number("12345678901234567890"), "ok": true, "none": nil,
		"nested": map[string]any{"password": "pw", "deeper": map[string]any{"k": []any{"a", 1.5, nil}}},
		"list":   []any{map[string]any{"password": "x"}, "y"}, "empty": map[string]any{}, "none_list": []any{}}
}

func TestEventEncoderMatchesTheGenericPath(t *testing.T) {
	proxy := Input{Kind: audit.KindHTTPRequest,
		Identity: identity.Identity{Namespace: "ns", Sandbox: "sb", SourceIP: "127.0.0.3"},
		HTTP: &HTTP{Method: "POST", Host: "api.anthropic.com", Port: 443, Path: "/v1/messages", Route: "anthropic",
			Model: "claude-sonnet-4", MaxTokens: 4096, Stream: true},
		Grants: map[string]any{"models": []any{"claude-sonnet-4"}, "budget": map[string]any{"tokens": 100000}},
		Usage:  map[string]int64{"requests_per_minute": 7, "tokens_today": 123456}}
	escaping := mcpCall(map[string]any{"q": "quote \" backslash \\ newline \n tab \t nul \x00 <html>&amp; \u2028 é 日本 🙂",
		"bad utf8 \xff": "\xfe\xfd", "key/with~slash": "v"})
	tests := []struct {
		name   string
		in     Input
		d      Decision
		masks  []string
		labels map[string]string
	}{
		{"MCP call with nested arguments, default mask", mcpCall(nestedArgs()),
			Decision{Allow: true, Reason: "ok", Code: "allow", Credential: "gh", Revision: "rev1"}, DefaultMask, map[string]string{"id": "r1", "version": "v"}},
		{"MCP call, no masks, no labels", mcpCall(nestedArgs()), Decision{Reason: "no", Code: "deny"}, []string{}, nil},
		{"proxy request with model and tokens", proxy, Decision{Allow: true, Code: "allow", Revision: "r"}, DefaultMask, nil},
		{"unicode and characters that need escaping", escaping, Decision{Reason: "<denied> \"x\"", Code: "deny"}, []string{}, nil},
		{"escaped pointer segment masks a key with a slash", escaping, Decision{}, []string{"/input/mcp/arguments/key~1with~0slash", "/input/mcp/arguments/key~1with~1slash"}, nil},
		{"empty and nil fields", Input{Kind: audit.KindToolsCall, MCP: &MCP{}}, Decision{}, DefaultMask, map[string]string{}},
		{"no mcp nor http section", Input{Kind: audit.KindHTTPRequest}, Decision{}, DefaultMask, nil},
		{"a hidden target's report-only denial", Input{Kind: audit.KindToolsCall, MCP: &MCP{Upstream: "u", Tool: "t", Hidden: true}},
			Decision{Reason: "no", Code: "tool_not_allowed", ReportOnly: true}, DefaultMask, nil},
		{"a missing target, exists and visible masked", Input{Kind: audit.KindToolsCall, MCP: &MCP{Tool: "t", NotFound: true, Hidden: true}},
			Decision{Code: "not_found"}, []string{"/input/mcp/exists", "/input/mcp/visible", "/result/enforce"}, nil},
		{"masks that hit and miss", mcpCall(nestedArgs()), Decision{Allow: true, Credential: "gh"},
			[]string{"/input/mcp/arguments/token", "/input/mcp/arguments/absent", "/input/http/host", "/input/mcp/arguments/empty/*",
				"/input/mcp/arguments/none_list/*", "/input/mcp/arguments/title/x", "/result/credential", "/result/absent"}, nil},
		{"nested pointer masks, arrays and objects", mcpCall(nestedArgs()), Decision{},
			[]string{"/input/mcp/arguments/nested/password", "/input/mcp/arguments/nested/deeper/k/*", "/input/mcp/arguments/list/*",
				"/input/mcp/arguments/list/password", "/input/identity/labels/*", "/input/usage/x", "/input/grants/*"}, nil},
		{"a mask under a value an earlier mask replaced misses", mcpCall(nestedArgs()), Decision{},
			[]string{"/input/mcp/arguments/nested", "/input/mcp/arguments/nested/password", "/input/mcp/arguments/*", "/input/mcp/arguments/token"}, nil},
		{"a mask above a value an earlier mask replaced hits too", mcpCall(nestedArgs()), Decision{},
			[]string{"/input/mcp/arguments/nested/password", "/input/mcp/arguments/nested", "/input/mcp/*", "/input/mcp/tool"}, nil},
		{"whole sections and scalars", proxy, Decision{Allow: true, Code: "allow"},
			[]string{"/input/http", "/input/kind", "/input/identity/known", "/input/grants/budget/tokens", "/input/usage/*", "/result/allow"}, nil},
		{"arguments JSON cannot carry log the kind only", mcpCall(map[string]any{"x": math.NaN(), "token": "t"}), Decision{Code: "deny"},
			[]string{"/input/mcp/arguments/token", "/input/kind"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			masks := parseMasks(t, tt.masks)
			item := &loggedDecision{id: "0190b7a0-0000-7000-8000-000000000001", path: DecisionPath,
				at: time.Date(2026, 11, 30, 20, 1, 2, 345678900, time.FixedZone("x", 3600)), in: tt.in, d: tt.d}
			got := newEventEncoder(masks, tt.labels).encode(nil, item)
			require.Equal(t, byte('\n'), got[len(got)-1], "one line")
			var ev logs.EventV1
			require.NoError(t, json.Unmarshal(got, &ev), "decodes as OPA's EventV1: %s", got)

			if math.IsNaN(tt.in.MCP.argumentOr("x")) {
				// The generic path dropped such an event (json.Marshal refuses the NaN); the
				// encoder logs what can be logged, as for any input the engine could not read.
				assert.Equal(t, map[string]any{"kind": MaskedValue}, *ev.Input)
				assert.Equal(t, []string{"/input/kind"}, ev.Masked)
				return
			}
			want, err := referenceEvent(t, masks, tt.labels, item)
			require.NoError(t, err)
			assert.Equal(t, decoded(t, want), decoded(t, got), "new: %s\nold: %s", got, want)
		})
	}
}

// argumentOr is the float argument named k, or 0.
func (m *MCP) argumentOr(k string) float64 {
	if m == nil {
		return 0
	}
	f, _ := m.Arguments[k].(float64)
	return f
}

func TestEventEncoderDoesNotChangeTheInput(t *testing.T) {
	args := nestedArgs()
	item := &loggedDecision{id: "x", path: DecisionPath, at: time.Now(), in: mcpCall(args)}
	newEventEncoder(parseMasks(t, []string{"/input/mcp/arguments/*", "/input/mcp/arguments/nested/password"}), nil).encode(nil, item)
	assert.Equal(t, nestedArgs(), args)
}

func FuzzEventEncoder(f *testing.F) {
	f.Add([]byte(`{"a":{"b":[1,"x",null]},"c":"\u2028"}`), "team", "a\"b", "/input/mcp/arguments/a/b", "/input/mcp/arguments/*")
	f.Add([]byte(`{"token":"s","n":-1.5e-9}`), "", "\xff", "/input/mcp/arguments/token", "/result/reason")
	f.Add([]byte(`{}`), "k", "v", "/input/identity/labels/k", "/input/mcp")
	f.Fuzz(func(t *testing.T, args []byte, key, val, mask1, mask2 string) {
		var a map[string]any
		if json.Unmarshal(args, &a) != nil {
			return
		}
		in := mcpCall(a)
		in.Identity.Labels = map[string]string{key: val}
		var raw []string
		for _, m := range []string{mask1, mask2} {
			if CheckMask(m) == nil {
				raw = append(raw, m)
			}
		}
		masks := parseMasks(t, raw)
		labels := map[string]string{key: val}
		item := &loggedDecision{id: val, path: DecisionPath, at: time.Unix(1, 2), in: in, d: Decision{Reason: val, Credential: key}}
		got := newEventEncoder(masks, labels).encode(nil, item)
		if !json.Valid(got) {
			t.Fatalf("not JSON: %q", got)
		}
		want, err := referenceEvent(t, masks, labels, item)
		require.NoError(t, err)
		assert.Equal(t, decoded(t, want), decoded(t, got))
	})
}
