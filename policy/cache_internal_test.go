package policy

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
)

func compileModule(t *testing.T, src string) *ast.Compiler {
	t.Helper()
	m, err := ast.ParseModuleWithOpts("p.rego", src, ast.ParserOptions{RegoVersion: ast.RegoV1})
	require.NoError(t, err)
	c := ast.NewCompiler()
	c.Compile(map[string]*ast.Module{"p.rego": m})
	require.False(t, c.Failed(), "%v", c.Errors)
	return c
}

func pathStrings(paths []inputPath) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = ast.Ref(append([]*ast.Term{ast.InputRootDocument}, p...)).String()
	}
	return out
}

func TestInputDependencies(t *testing.T) {
	cases := []struct {
		name, body string
		want       []string
	}{
		{"static references, the shorter covering the longer",
			`decision := {"allow": true} if { input.http.model == "m"; input.http.host == "h"; input.http == {} }
			 d2 if input.identity.template == "t"`,
			[]string{"input.http", "input.identity.template"}},
		{"a dynamic key keeps its constant prefix",
			`decision := {"allow": true} if { some k; input.identity.labels[k] == "x" }`,
			[]string{"input.identity.labels"}},
		{"input passed whole to a function is all of input",
			`decision := {"allow": object.get(input, ["identity", "labels", "team"], "") == "a"}`,
			[]string{"input"}},
		{"a reference inside a data lookup counts",
			`decision := {"allow": data.allowed[input.mcp.tool]}`,
			[]string{"input.mcp.tool"}},
		{"a number operand ends the prefix",
			`decision := {"allow": input.args.list[0] == 1}`,
			[]string{"input.args.list"}},
		{"references in comprehensions and every",
			`decision := {"allow": count([x | some x in input.a.b]) > 0} if { every y in input.c { y > 1 } }`,
			[]string{"input.a.b", "input.c"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			paths, ok := inputDependencies(compileModule(t, "package sandgate\n"+tc.body))
			require.True(t, ok)
			assert.Equal(t, tc.want, pathStrings(paths))
		})
	}
}

func TestNondeterministicPoliciesAreNotCached(t *testing.T) {
	for _, body := range []string{
		`decision := {"allow": time.now_ns() > 0}`,
		`decision := {"allow": rand.intn("x", 2) == 0}`,
		`decision := {"allow": r.status_code == 200} if r := http.send({"method": "GET", "url": "http://127.0.0.1:1"})`,
		`decision := {"allow": true} if { f(input.x) }
		 f(x) if { count(net.lookup_ip_addr(x)) > 0 }`,
		`decision := {"allow": x} if { x := uuid.rfc4122("k") != "" }`,
	} {
		c := compileModule(t, "package sandgate\n"+body)
		_, ok := inputDependencies(c)
		assert.False(t, ok, body)
		assert.Nil(t, newDecisionCache(c, 10), body)
	}
	assert.Nil(t, newDecisionCache(compileModule(t, "package sandgate\ndecision := {\"allow\": true}"), 0), "size 0 turns it off")
}

func TestCacheKey(t *testing.T) {
	c := newDecisionCache(compileModule(t, `package sandgate
decision := {"allow": true} if { input.http.model == "m"; input.identity.template == "t"; input.grants.x == 1 }`), 10)
	require.NotNil(t, c)
	key := func(in *Input) string {
		k, ok := c.key(nil, in)
		require.True(t, ok)
		return string(k)
	}
	in := func(template string, h *HTTP, grants map[string]any) *Input {
		return &Input{Identity: identity.Identity{Template: template, Sandbox: "s1"}, HTTP: h, Grants: grants}
	}
	base := key(in("t", &HTTP{Model: "m", Host: "a"}, nil))
	other := in("t", &HTTP{Model: "m", Host: "b"}, map[string]any{"y": 2})
	other.Identity.Sandbox = "s2"
	assert.Equal(t, base, key(other), "fields the policy does not read do not split the key")
	assert.NotEqual(t, base, key(in("t", &HTTP{Model: "n"}, nil)))
	assert.NotEqual(t, key(in("t", nil, nil)), key(in("t", &HTTP{Model: "-"}, nil)), "undefined differs from every value")
	assert.NotEqual(t, key(in("t", nil, nil)), key(in("t", &HTTP{}, nil)), "undefined differs from the empty string")
	assert.NotEqual(t, key(in("t", nil, map[string]any{"x": 1.0})), key(in("t", nil, map[string]any{"x": "1"})))
	assert.NotEqual(t, key(in("t", &HTTP{Model: "a\x00b"}, nil)), key(in("b", &HTTP{Model: "a"}, nil)),
		"a NUL inside a value cannot forge a separator")

	big := newDecisionCache(compileModule(t, "package sandgate\ndecision := {\"allow\": count(input.mcp.arguments) > 0}"), 10)
	_, ok := big.key(nil, &Input{MCP: &MCP{Arguments: map[string]any{"content": strings.Repeat("x", 4096)}}})
	assert.False(t, ok, "an input whose referenced part is large is not cached")
}

// Input.field must agree with the document Value builds, for every path a policy can name;
// the decision cache keys on it without building the document.
func TestInputFieldMatchesDocument(t *testing.T) {
	var paths [][]*ast.Term
	for _, p := range []string{
		"", "kind", "nope", "identity", "identity.namespace", "identity.sandbox", "identity.template", "identity.claim",
		"identity.labels", "identity.labels.team", "identity.labels.nope", "identity.source_ip", "identity.known", "identity.nope",
		"identity.known.x", "mcp", "mcp.upstream", "mcp.tool", "mcp.tool.x", "mcp.nope", "mcp.arguments", "mcp.arguments.owner",
		"mcp.arguments.owner.x", "mcp.arguments.nested", "mcp.arguments.nested.deep", "mcp.arguments.nested.deep.x",
		"mcp.arguments.list", "mcp.arguments.list.x", "mcp.arguments.nope", "mcp.arguments.empty", "mcp.arguments.null",
		"mcp.arguments.null.x", "http", "http.method", "http.host", "http.port", "http.path", "http.route", "http.model",
		"http.max_tokens", "http.stream", "http.nope", "http.model.x", "grants", "grants.github_repos", "grants.github_repos.x",
		"grants.nope", "grants.team.name", "usage", "usage.requests_per_minute", "usage.nope", "usage.requests_per_minute.x",
	} {
		var path []*ast.Term
		if p != "" {
			for _, k := range strings.Split(p, ".") {
				path = append(path, ast.StringTerm(k))
			}
		}
		paths = append(paths, path)
	}
	inputs := []*Input{
		{Kind: audit.KindToolsCall, Identity: identity.Identity{Namespace: "n", Sandbox: "s", Template: "t", Known: true, Labels: map[string]string{"team": "a"}},
			MCP: &MCP{Upstream: "github", Tool: "create", Arguments: map[string]any{"owner": "acme", "list": []any{"x", 1.5},
				"nested": map[string]any{"deep": map[string]any{"x": true}}, "empty": map[string]any{}, "null": nil}},
			Grants: map[string]any{"github_repos": []any{"acme/api"}, "team": map[string]any{"name": "core"}},
			Usage:  map[string]int64{"requests_per_minute": 7}},
		{Kind: audit.KindHTTPRequest, Identity: identity.Identity{SourceIP: "127.0.0.9"},
			HTTP: &HTTP{Method: "POST", Host: "api.anthropic.com", Port: 443, Path: "/v1/messages", Route: "anthropic", Model: "m", MaxTokens: -1, Stream: true}},
		{Kind: audit.KindToolsList, MCP: &MCP{Upstream: "u"}},
		{},
	}
	for i, in := range inputs {
		doc, err := in.Value()
		require.NoError(t, err)
		for _, p := range paths {
			got, err := in.field(p)
			require.NoError(t, err)
			want := lookupValue(doc, p)
			name := fmt.Sprintf("input %d, path %v", i, p)
			if want == nil {
				assert.Nil(t, got, name)
				continue
			}
			require.NotNil(t, got, name)
			assert.Equal(t, want.String(), got.String(), name)
			assert.Zero(t, want.Compare(got), name)
		}
	}
}

// FuzzInputField: for any decoded JSON arguments and grants and any path, the value the cache
// keys on is the value the policy would see in the document.
func FuzzInputField(f *testing.F) {
	f.Add(`{"owner":"acme","nested":{"deep":[1,"x",{"k":null}]}}`, `{"github_repos":["acme/api"]}`, "mcp.arguments.nested.deep")
	f.Add(`{"a":{"b":{"c":true}}}`, `{}`, "mcp.arguments.a.b.c")
	f.Add(`{"":{"":""}}`, `{"x":{"y":1.5e300}}`, "grants.x.y")
	f.Add(`{"list":[{"a":1}]}`, `{"t":"s"}`, "grants.t.u")
	f.Add(`{}`, `{}`, "identity.labels.team")
	f.Fuzz(func(t *testing.T, args, grants, path string) {
		var a, g map[string]any
		if json.Unmarshal([]byte(args), &a) != nil || json.Unmarshal([]byte(grants), &g) != nil {
			return
		}
		in := &Input{Kind: audit.KindToolsCall, Identity: identity.Identity{Template: "t", Known: true, Labels: map[string]string{"team": "a"}},
			MCP: &MCP{Upstream: "u", Tool: "x", Arguments: a}, Grants: g, Usage: map[string]int64{"n": 1}}
		var p []*ast.Term
		if path != "" {
			for _, k := range strings.Split(path, ".") {
				p = append(p, ast.StringTerm(k))
			}
		}
		doc, err := in.Value()
		if err != nil {
			t.Skip()
		}
		got, err := in.field(p)
		if err != nil {
			t.Fatalf("field(%s): %v", path, err)
		}
		want := lookupValue(doc, p)
		switch {
		case want == nil && got == nil:
		case want == nil || got == nil:
			t.Fatalf("path %q: document %v, field %v", path, want, got)
		case want.Compare(got) != 0 || want.String() != got.String():
			t.Fatalf("path %q: document %s, field %s", path, want, got)
		}
	})
}
