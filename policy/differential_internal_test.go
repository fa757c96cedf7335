package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
)

// The engine answers from a decision cache keyed by the parts of input its policies read, found
// by an analysis of the compiled modules (cache.go). These tests hold it to OPA's own `rego` API,
// evaluated fresh for every input: the same decision for every shipped policy on table and
// random inputs, and, for policies that reach input every way Rego allows, never one cache key
// for two inputs OPA decides differently. An OPA upgrade that adds a way to read input the
// analysis does not see fails the second test.

// opaReference is OPA's prepared evaluation of Query over a policy folder, loaded by OPA's own
// loader (tests left out, as `opa eval` with a filter would).
type opaReference struct{ pq rego.PreparedEvalQuery }

func newOPAReference(t *testing.T, dir string) *opaReference {
	t.Helper()
	skipTests := func(_ string, info fs.FileInfo, _ int) bool { return strings.HasSuffix(info.Name(), "_test.rego") }
	pq, err := rego.New(rego.Query(Query), rego.Load([]string{dir}, skipTests)).PrepareForEval(context.Background())
	require.NoError(t, err)
	return &opaReference{pq: pq}
}

// decide evaluates doc (a decoded JSON input) and reads the result as the engine does.
func (o *opaReference) decide(t *testing.T, doc any) Decision {
	t.Helper()
	rs, err := o.pq.Eval(context.Background(), rego.EvalInput(doc))
	require.NoError(t, err)
	if len(rs) == 0 {
		return Decision{Reason: fmt.Sprintf(reasonUndefinedFmt, Query), Code: CodeUndefined}
	}
	return decisionFromResult(rs[0].Expressions[0].Value)
}

// document is in as the JSON document OPA is given: the engine's own input value, printed.
func document(t *testing.T, in *Input) any {
	t.Helper()
	v, err := in.Value()
	require.NoError(t, err)
	doc, err := ast.JSON(v)
	require.NoError(t, err)
	return doc
}

func withoutRevision(d Decision) Decision {
	d.Revision, d.Err = "", nil
	return d
}

// TestShippedPoliciesDecideAsOPAsRegoAPI decides the example inputs of examples/inputs and
// 2,000 random inputs with the engine (each random one twice: evaluated, then from the cache)
// and with OPA's rego API: every decision is the same.
func TestShippedPoliciesDecideAsOPAsRegoAPI(t *testing.T) {
	ctx := context.Background()
	e, err := New(ctx, "../policies")
	require.NoError(t, err)
	ref := newOPAReference(t, "../policies")

	examples, err := filepath.Glob("../examples/inputs/*.json")
	require.NoError(t, err)
	require.NotEmpty(t, examples)
	for _, f := range examples {
		raw, err := os.ReadFile(f)
		require.NoError(t, err)
		var doc any
		require.NoError(t, json.Unmarshal(raw, &doc))
		assert.Equal(t, ref.decide(t, doc), withoutRevision(e.DecideDocument(ctx, doc)), filepath.Base(f))
	}

	r := rand.New(rand.NewPCG(38, 1))
	allowed := 0
	for i := range 2000 {
		in := shippedInput(r)
		want := ref.decide(t, document(t, in))
		for round := range 2 {
			require.Equal(t, want, withoutRevision(e.Decide(ctx, in)), "input %d, round %d: %+v", i, round, in)
		}
		if want.Allow {
			allowed++
		}
	}
	assert.Greater(t, allowed, 200, "the random inputs reach the allowing rules")
}

// shippedInput is a random call in the vocabulary of the shipped policies and their data.
func shippedInput(r *rand.Rand) *Input {
	pick := func(xs ...string) string { return xs[r.IntN(len(xs))] }
	in := &Input{Identity: identity.Identity{Namespace: "agents", Sandbox: pick("coder-1", "triage-1"), SourceIP: "127.0.0.2",
		Template: pick("coding-agent", "triage-agent", "unknown-template"), Known: r.IntN(8) > 0,
		Labels: map[string]string{"team": pick("platform", "web")}},
		Usage: map[string]int64{"requests_per_minute": int64(r.IntN(100))}}
	if r.IntN(2) == 0 {
		in.Kind = audit.Kind(pick(string(audit.KindToolsCall), string(audit.KindToolsList), string(audit.KindResourcesRead), string(audit.KindPromptsGet)))
		in.MCP = &MCP{Upstream: pick("github", "everything", "jira"), Tool: pick("create_pull_request", "get_issue", "echo", "push_files", "delete_repo", "get-env"),
			Arguments: map[string]any{"owner": pick("acme", "evil"), "repo": pick("webapp", "api")}}
		in.Grants = map[string]any{"github_repos": []any{pick("acme/webapp", "acme/api")}}
		return in
	}
	in.Kind = audit.Kind(pick(string(audit.KindHTTPRequest), string(audit.KindHTTPConnect)))
	in.HTTP = &HTTP{Method: pick("POST", "GET", "CONNECT"), Host: pick("api.anthropic.com", "api.openai.com", "proxy.golang.org", "evil.example"),
		Port: []int{443, 8443}[r.IntN(2)], Path: pick("/v1/messages", "/v1/models", "/"), Route: pick("", "anthropic", "openai"),
		Model: pick("claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4", ""), MaxTokens: []int64{-1, 1024, 8192, 64000}[r.IntN(4)], Stream: r.IntN(2) == 0}
	return in
}

// readingPolicies read input every way a policy author can: paths, dynamic keys, keys taken
// from input itself, input whole in builtins, walks, filters and comprehensions, through a
// variable, a function, a partial set, `every`, `with`, and data indexed by input.
var readingPolicies = map[string]string{
	"a path":                         `decision := {"allow": input.http.model == "m1"}`,
	"a label under a key from input": `decision := {"allow": input.identity.labels[input.mcp.tool] == "yes"}`,
	"a dynamic label key":            `decision := {"allow": true} if { some k; input.identity.labels[k] == "yes" }` + "\ndefault decision := {\"allow\": false}",
	"input through a variable":       `decision := {"allow": x.http.stream} if x := input`,
	"input whole to object.get":      `decision := {"allow": object.get(input, ["grants", "github_repos"], []) == ["acme/api"]}`,
	"input whole to walk":            `decision := {"allow": count([p | walk(input, [p, v]); v == "evil"]) == 0}`,
	"input whole to json.filter":     `decision := {"allow": json.filter(input, ["http/model"]).http.model == "m1"}`,
	"a function of input":            "f(x) := x.usage.requests_per_minute < 5\ndecision := {\"allow\": f(input)}",
	"a comprehension over arguments": `decision := {"allow": count([k | some k, _ in input.mcp.arguments]) < 2}`,
	"every argument":                 "default decision := {\"allow\": false}\ndecision := {\"allow\": true} if { every v in input.mcp.arguments { v != \"evil\" } }",
	"data indexed by input":          "allowed := {\"t1\": true}\ndecision := {\"allow\": object.get(allowed, input.identity.template, false)}",
	"with input replaced":            "inner if { input.mcp.tool == \"echo\"; input.identity.sandbox == \"fixed\" }\ndefault decision := {\"allow\": false}\ndecision := {\"allow\": true} if inner with input.identity.sandbox as \"fixed\"",
	"a partial set":                  "deny contains \"big\" if input.http.max_tokens > 100\ndecision := {\"allow\": count(deny) == 0}",
	"a whole section compared":       `decision := {"allow": input.identity == {"namespace": "n", "sandbox": "a", "template": "t1", "claim": "", "labels": {}, "source_ip": "127.0.0.2", "known": true}}`,
	"an array member":                `decision := {"allow": true} if { some i; input.grants.github_repos[i] == "acme/api" }` + "\ndefault decision := {\"allow\": false}",
	"a builtin over a path":          "default decision := {\"allow\": false}\ndecision := {\"allow\": true} if { startswith(input.http.path, \"/v1\"); input.http.port == 443 }",
	"the kind and usage":             "default decision := {\"allow\": false}\ndecision := {\"allow\": input.kind == \"mcp.tools_call\"} if input.usage.tokens_today < 10",
}

// randomInput draws every field from a small set, so that inputs often agree on what a policy
// reads and differ in what it does not.
func randomInput(r *rand.Rand) *Input {
	pick := func(xs ...string) string { return xs[r.IntN(len(xs))] }
	in := &Input{Kind: audit.Kind(pick(string(audit.KindToolsCall), string(audit.KindHTTPRequest))),
		Identity: identity.Identity{Namespace: pick("n", "m"), Sandbox: pick("a", "b", "fixed"), Template: pick("t1", "t2"),
			SourceIP: "127.0.0.2", Known: r.IntN(4) > 0, Labels: map[string]string{}},
		Usage: map[string]int64{"requests_per_minute": int64(r.IntN(10)), "tokens_today": int64(r.IntN(20))}}
	for _, k := range []string{"team", "echo", "tier"} {
		if r.IntN(2) == 0 {
			in.Identity.Labels[k] = pick("yes", "no")
		}
	}
	if r.IntN(3) > 0 {
		args := map[string]any{}
		for _, k := range []string{"owner", "repo", "title"} {
			if r.IntN(2) == 0 {
				args[k] = pick("acme", "evil", "x")
			}
		}
		in.MCP = &MCP{Upstream: pick("github", "jira"), Tool: pick("echo", "team", "tier", "create"), Arguments: args, Hidden: r.IntN(2) == 0}
		in.Grants = map[string]any{"github_repos": []any{pick("acme/api", "acme/web")}}
	}
	if r.IntN(3) > 0 {
		in.HTTP = &HTTP{Method: pick("GET", "POST"), Host: pick("h1", "h2"), Port: []int{443, 8443}[r.IntN(2)], Path: pick("/v1/x", "/admin"),
			Route: pick("", "r"), Model: pick("m1", "m2"), MaxTokens: []int64{-1, 50, 500}[r.IntN(3)], Stream: r.IntN(2) == 0}
	}
	return in
}

// mutate changes one field of a copy of in.
func mutate(r *rand.Rand, in *Input) *Input {
	b := randomInput(r)
	c := *in
	c.Identity.Labels = map[string]string{}
	for k, v := range in.Identity.Labels {
		c.Identity.Labels[k] = v
	}
	switch r.IntN(8) {
	case 0:
		c.Kind = b.Kind
	case 1:
		c.Identity.Sandbox, c.Identity.Template = b.Identity.Sandbox, b.Identity.Template
	case 2:
		c.Identity.Labels, c.Identity.Known, c.Identity.Namespace = b.Identity.Labels, b.Identity.Known, b.Identity.Namespace
	case 3:
		c.Usage = b.Usage
	case 4, 5:
		c.MCP, c.Grants = b.MCP, b.Grants
	default:
		c.HTTP = b.HTTP
	}
	return &c
}

// keyCollisions decides pairs of inputs that differ in one field and reports those the cache
// would confuse: equal keys, different decisions from OPA. It also counts the pairs with equal
// keys it checked.
func keyCollisions(t *testing.T, c *decisionCache, ref *opaReference, pairs int) (collisions []string, checked int) {
	r := rand.New(rand.NewPCG(38, 2))
	for range pairs {
		a := randomInput(r)
		b := mutate(r, a)
		ka, oka := c.key(nil, a)
		kb, okb := c.key(nil, b)
		if !oka || !okb || string(ka) != string(kb) {
			continue
		}
		checked++
		if da, db := ref.decide(t, document(t, a)), ref.decide(t, document(t, b)); da != db {
			collisions = append(collisions, fmt.Sprintf("key %q: %+v decides %v, %+v decides %v", ka, a, da.Allow, b, db.Allow))
		}
	}
	return collisions, checked
}

// compiledFolder writes module src to a folder and compiles it as the engine does.
func compiledFolder(t *testing.T, src string) (*revision, string) {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "p.rego"), []byte("package sandgate\n"+src+"\n"), 0o644))
	files, err := readPolicyFiles(dir)
	require.NoError(t, err)
	rev, err := compile(context.Background(), dir, files, DefaultCacheEntries)
	require.NoError(t, err)
	require.NotNil(t, rev.cache, "the policy is cacheable")
	return rev, dir
}

// TestCacheKeyHoldsEverythingOPAReads checks the input-reference analysis against OPA itself:
// for the shipped policies and for each way of reading input, no two inputs with one cache key
// get different decisions from OPA's rego API.
func TestCacheKeyHoldsEverythingOPAReads(t *testing.T) {
	shipped, err := readPolicyFiles("../policies")
	require.NoError(t, err)
	rev, err := compile(context.Background(), "../policies", shipped, DefaultCacheEntries)
	require.NoError(t, err)
	collisions, checked := keyCollisions(t, rev.cache, newOPAReference(t, "../policies"), 2000)
	assert.Empty(t, collisions, "shipped policies")
	assert.Positive(t, checked)

	for name, src := range readingPolicies {
		t.Run(name, func(t *testing.T) {
			rev, dir := compiledFolder(t, src)
			collisions, checked := keyCollisions(t, rev.cache, newOPAReference(t, dir), 2000)
			assert.Empty(t, collisions, "the cache key misses what the policy reads")
			assert.Positive(t, checked, "some pairs shared a key")
		})
	}
}

// TestCacheKeyCheckFindsAMissedReference drops one path from the analysis of each policy that
// reads more than one part of input: the check above must then find inputs the key confuses,
// or it could never fail.
func TestCacheKeyCheckFindsAMissedReference(t *testing.T) {
	found := 0
	for _, name := range []string{"a path", "a label under a key from input", "a function of input", "a builtin over a path", "the kind and usage"} {
		rev, dir := compiledFolder(t, readingPolicies[name])
		ref := newOPAReference(t, dir)
		paths := make([]inputPath, len(rev.cache.parts))
		for i, p := range rev.cache.parts {
			paths[i] = p.path
		}
		for drop := range paths {
			blind := &decisionCache{parts: keyParts(append(append([]inputPath{}, paths[:drop]...), paths[drop+1:]...)), max: 10, entries: map[string]Decision{}}
			if collisions, _ := keyCollisions(t, blind, ref, 2000); len(collisions) > 0 {
				found++
			} else {
				t.Errorf("%s: without %v the check found nothing", name, paths[drop])
			}
		}
	}
	assert.Positive(t, found)
}
