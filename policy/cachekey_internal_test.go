package policy

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
)

// referenceKey is the key as it was built before the struct renderers: every part resolved to
// an AST value by Input.field and printed. It is the specification the renderers must match.
func referenceKey(c *decisionCache, b []byte, in *Input) ([]byte, bool) {
	for _, p := range c.parts {
		v, err := in.field(p.path)
		switch {
		case err != nil:
			return b, false
		case v == nil:
			b = append(b, "-\x00"...)
			continue
		}
		if s, ok := v.(ast.String); ok {
			b = strconv.AppendQuote(b, string(s))
		} else {
			b = append(b, v.String()...)
		}
		b = append(b, 0)
		if len(b) > maxCacheKeyBytes {
			return b, false
		}
	}
	return b, true
}

func parsePath(s string) inputPath {
	var p inputPath
	if s != "" {
		for _, k := range strings.Split(s, ".") {
			p = append(p, ast.StringTerm(k))
		}
	}
	return p
}

func cacheOf(paths ...string) *decisionCache {
	ps := make([]inputPath, len(paths))
	for i, s := range paths {
		ps[i] = parsePath(s)
	}
	return &decisionCache{parts: keyParts(ps), max: 10, entries: map[string]Decision{}}
}

// Paths the struct renderers own, and paths left to the field route.
var (
	directPaths = []string{"kind", "identity.namespace", "identity.sandbox", "identity.template", "identity.claim",
		"identity.source_ip", "identity.known", "identity.labels", "identity.labels.team", "identity.labels.a",
		"mcp.upstream", "mcp.tool", "mcp.exists", "mcp.visible", "mcp.arguments.owner", "mcp.arguments.list", "mcp.arguments.nested.deep",
		"mcp.arguments.owner.x", "http.method", "http.host", "http.port", "http.path", "http.route", "http.model",
		"http.max_tokens", "http.stream", "usage.requests_per_minute", "usage.nope", "grants.github_repos",
		"grants.team.name", "grants.odd", "grants.odd.k", "grants.nope"}
	fieldPaths = []string{"", "kind.x", "nope", "identity", "identity.nope", "identity.labels.team.x", "identity.known.x",
		"mcp", "mcp.nope", "mcp.arguments", "mcp.tool.x", "http", "http.nope", "http.port.x", "grants", "usage",
		"usage.requests_per_minute.x"}
)

func TestCacheKeyRendererIsChosenByPath(t *testing.T) {
	for _, p := range directPaths {
		assert.NotEqual(t, renderField, cacheOf(p).parts[0].op, "%s is rendered from the struct", p)
	}
	for _, p := range fieldPaths {
		assert.Equal(t, renderField, cacheOf(p).parts[0].op, "%s takes the field route", p)
	}
	dotted := keyParts([]inputPath{{ast.StringTerm("identity.known")}, {ast.StringTerm("http"), ast.StringTerm("port.x")}})
	for _, p := range dotted {
		assert.Equal(t, renderField, p.op, "a key holding a dot is one key, not a field path: %v", p.path)
	}
}

// adversarial strings: separators, quotes, NULs, the undefined marker, invalid UTF-8, and
// texts that look like printed values.
var keyStrings = []string{"", "-", "a", "b", "b,c", `"`, `\`, "a\x00b", "\x00", "é", "\xff", `", "c": "`, "{}", "null", "true", "1"}

func randomKeyInput(r *rand.Rand) *Input {
	str := func() string { return keyStrings[r.IntN(len(keyStrings))] }
	in := &Input{
		Kind:     audit.Kind([]string{"", string(audit.KindToolsCall), string(audit.KindToolsList), string(audit.KindHTTPRequest), "-"}[r.IntN(5)]),
		Identity: identity.Identity{Namespace: str(), Sandbox: str(), Template: str(), Claim: str(), SourceIP: str(), Known: r.IntN(2) == 0},
	}
	switch r.IntN(4) {
	case 0: // nil labels
	case 1:
		in.Identity.Labels = map[string]string{}
	default:
		in.Identity.Labels = map[string]string{}
		for range 1 + r.IntN(3) {
			in.Identity.Labels[[]string{"a", "c", "team", `a"`, "", "a\x00"}[r.IntN(6)]] = str()
		}
	}
	json := func() any {
		switch r.IntN(7) {
		case 0:
			return nil
		case 1:
			return r.IntN(2) == 0
		case 2:
			return []any{str(), str()}[:r.IntN(3)]
		case 3:
			return []any{str(), 1.5, map[string]any{"k": str()}}
		case 4:
			return float64(r.IntN(3))
		case 5:
			return map[string]any{"deep": str(), "x": str()}
		}
		return str()
	}
	if r.IntN(3) > 0 {
		in.MCP = &MCP{Upstream: str(), Tool: str(), NotFound: r.IntN(2) == 0, Hidden: r.IntN(2) == 0}
		if r.IntN(4) > 0 {
			in.MCP.Arguments = map[string]any{"owner": json(), "list": json(), "nested": json()}
		}
	}
	if r.IntN(3) > 0 {
		in.HTTP = &HTTP{Method: str(), Host: str(), Port: r.IntN(3) * 443, Path: str(), Route: str(), Model: str(),
			MaxTokens: int64(r.IntN(3)) - 1, Stream: r.IntN(2) == 0}
	}
	if r.IntN(3) > 0 {
		in.Grants = map[string]any{"github_repos": json(), "team": map[string]any{"name": json()},
			"odd": []any{map[string]string{"k": str()}, str()}[r.IntN(2)]}
	}
	if r.IntN(2) > 0 {
		in.Usage = map[string]int64{"requests_per_minute": int64(r.IntN(3)) - 1}
	}
	return in
}

// The struct renderers print exactly what the AST route prints, so for many random inputs the
// key is byte for byte the reference key, and two inputs share a key exactly when they share
// the reference key.
func TestCacheKeyMatchesASTRendering(t *testing.T) {
	caches := map[string]*decisionCache{}
	for _, p := range append(append([]string{}, directPaths...), fieldPaths...) {
		caches[p] = cacheOf(p)
	}
	caches["shipped policies and labels"] = cacheOf("grants.github_repos", "http.host", "http.max_tokens", "http.model",
		"http.route", "identity.known", "identity.labels", "identity.template", "kind", "mcp.arguments.owner",
		"mcp.arguments.repo", "mcp.tool", "mcp.upstream")
	r := rand.New(rand.NewPCG(7, 11))
	inputs := make([]*Input, 4000)
	for i := range inputs {
		inputs[i] = randomKeyInput(r)
	}
	for name, c := range caches {
		byRef, byKey := map[string]string{}, map[string]string{}
		for i, in := range inputs {
			want, wantOK := referenceKey(c, nil, in)
			got, ok := c.key(nil, in)
			require.Equal(t, wantOK, ok, "%s, input %d: %+v", name, i, in)
			if !ok {
				continue
			}
			require.Equal(t, string(want), string(got), "%s, input %d: %+v", name, i, in)
			// Equal keys exactly when equal reference keys: the partitions coincide.
			if k, seen := byRef[string(want)]; seen {
				require.Equal(t, k, string(got), name)
			}
			if k, seen := byKey[string(got)]; seen {
				require.Equal(t, k, string(want), name)
			}
			byRef[string(want)], byKey[string(got)] = string(got), string(want)
		}
		if name == "identity.template" {
			assert.Less(t, len(byKey), len(inputs)/10, "the inputs share keys, so the partition check has teeth")
		}
	}
}

// Pairs built to collide if a renderer forgot to quote, separate or mark undefined.
func TestCacheKeyIsInjective(t *testing.T) {
	labels := func(l map[string]string) *Input { return &Input{Identity: identity.Identity{Labels: l}} }
	cases := []struct {
		name  string
		paths []string
		a, b  *Input
		equal bool
	}{
		{"a comma inside a label value is not a second label", []string{"identity.labels"},
			labels(map[string]string{"a": "b,c"}), labels(map[string]string{"a": "b", "c": ""}), false},
		{"quotes inside a label value are escaped", []string{"identity.labels"},
			labels(map[string]string{"a": `b", "c": "`}), labels(map[string]string{"a": "b", "c": ""}), false},
		{"a nil label map is the empty object the policy sees", []string{"identity.labels"},
			labels(nil), labels(map[string]string{}), true},
		{"no labels differ from one empty label", []string{"identity.labels"},
			labels(nil), labels(map[string]string{"": ""}), false},
		{"a missing label differs from an empty one", []string{"identity.labels.a"},
			labels(map[string]string{}), labels(map[string]string{"a": ""}), false},
		{"a missing label differs from one valued -", []string{"identity.labels.a"},
			labels(nil), labels(map[string]string{"a": "-"}), false},
		{"labels the path does not name do not split the key", []string{"identity.labels.a"},
			labels(map[string]string{"a": "x", "b": "1"}), labels(map[string]string{"a": "x"}), true},
		{"a NUL in one field cannot move text into the next", []string{"identity.namespace", "identity.template"},
			&Input{Identity: identity.Identity{Namespace: "a\x00\"b\"", Template: ""}},
			&Input{Identity: identity.Identity{Namespace: "a", Template: "b"}}, false},
		{"no mcp section is not an empty tool", []string{"mcp.tool"}, &Input{}, &Input{MCP: &MCP{}}, false},
		{"no http section is not a model named -", []string{"http.model"}, &Input{}, &Input{HTTP: &HTTP{Model: "-"}}, false},
		{"a missing argument is not null", []string{"mcp.arguments.owner"},
			&Input{MCP: &MCP{}}, &Input{MCP: &MCP{Arguments: map[string]any{"owner": nil}}}, false},
		{"a string argument is not the same text as a number", []string{"mcp.arguments.owner"},
			&Input{MCP: &MCP{Arguments: map[string]any{"owner": "1"}}}, &Input{MCP: &MCP{Arguments: map[string]any{"owner": 1.0}}}, false},
		{"an array of one string is not the string", []string{"grants.github_repos"},
			&Input{Grants: map[string]any{"github_repos": []any{"a"}}}, &Input{Grants: map[string]any{"github_repos": `["a"]`}}, false},
		{"an array element holding the separator is one element", []string{"grants.github_repos"},
			&Input{Grants: map[string]any{"github_repos": []any{`a", "b`}}}, &Input{Grants: map[string]any{"github_repos": []any{"a", "b"}}}, false},
		{"usage 0 differs from none", []string{"usage.requests_per_minute"},
			&Input{}, &Input{Usage: map[string]int64{"requests_per_minute": 0}}, false},
		{"a known sandbox differs from an unknown one", []string{"identity.known"},
			&Input{Identity: identity.Identity{Known: true}}, &Input{}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := cacheOf(tc.paths...)
			a, okA := c.key(nil, tc.a)
			b, okB := c.key(nil, tc.b)
			require.True(t, okA && okB)
			assert.Equal(t, tc.equal, string(a) == string(b), "%q vs %q", a, b)
			ra, _ := referenceKey(c, nil, tc.a)
			rb, _ := referenceKey(c, nil, tc.b)
			assert.Equal(t, tc.equal, string(ra) == string(rb), fmt.Sprintf("the reference agrees: %q vs %q", ra, rb))
		})
	}
}

// FuzzCacheKey: for any decoded JSON arguments and grants, labels and path, the key is the
// reference key.
func FuzzCacheKey(f *testing.F) {
	f.Add(`{"owner":"acme","list":["a","b"]}`, `{"github_repos":["acme/api"]}`, "a", "b,c", "mcp.arguments.owner")
	f.Add(`{"a":{"b":[true,null,"x"]}}`, `{}`, `"`, "\x00", "mcp.arguments.a.b")
	f.Add(`{}`, `{"x":{"y":[1.5,"s"]}}`, "", "-", "grants.x.y")
	f.Add(`{}`, `{}`, "team", "", "identity.labels")
	f.Fuzz(func(t *testing.T, args, grants, label, value, path string) {
		var a, g map[string]any
		if json.Unmarshal([]byte(args), &a) != nil || json.Unmarshal([]byte(grants), &g) != nil {
			return
		}
		in := &Input{Kind: audit.KindToolsCall, Identity: identity.Identity{Template: value, Labels: map[string]string{label: value}},
			MCP: &MCP{Upstream: label, Tool: value, Arguments: a}, Grants: g}
		c := cacheOf(path)
		want, wantOK := referenceKey(c, nil, in)
		got, ok := c.key(nil, in)
		if ok != wantOK || string(got) != string(want) {
			t.Fatalf("path %q: key %q (%v), reference %q (%v)", path, got, ok, want, wantOK)
		}
	})
}

func FuzzQuote(f *testing.F) {
	for _, s := range []string{"", "tools.call", "ns-1", `a"b`, `a\b`, "é", "\x7f", "\x00", "~ !"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := string(quote([]byte("x"), s)), string(strconv.AppendQuote([]byte("x"), s)); got != want {
			t.Fatalf("quote(%q) = %s, strconv.AppendQuote %s", s, got, want)
		}
	})
}
