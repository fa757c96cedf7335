package policy_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

const allowEcho = `package sandgate

default decision := {"allow": false, "reason": "only echo", "code": "not_echo"}

decision := {"allow": true, "reason": "echo is fine", "credential": "gh"} if input.mcp.tool == "echo"
`

func writePolicy(t *testing.T, dir, name, src string) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(src), 0o644))
}

func newEngine(t *testing.T, files map[string]string, opts ...policy.Option) (*policy.Engine, string) {
	t.Helper()
	dir := t.TempDir()
	for name, src := range files {
		writePolicy(t, dir, name, src)
	}
	e, err := policy.New(context.Background(), dir, opts...)
	require.NoError(t, err)
	return e, dir
}

func callInput(tool string) *policy.Input {
	return &policy.Input{
		Kind:     audit.KindToolsCall,
		Identity: identity.Identity{Namespace: "agents", Sandbox: "sb", Template: "t", Known: true},
		MCP:      &policy.MCP{Upstream: "u", Tool: tool, Arguments: map[string]any{"n": 1.5, "s": []any{"a"}}},
	}
}

func TestDecide(t *testing.T) {
	cases := []struct {
		name       string
		policy     string
		tool       string
		wantAllow  bool
		wantCode   string
		wantReason string
		wantCred   string
	}{
		{"allowed call carries the policy's reason and credential", allowEcho, "echo", true, policy.CodePolicyAllow, "echo is fine", "gh"},
		{"denied call carries the policy's reason and code", allowEcho, "rm", false, "not_echo", "only echo", ""},
		{"undefined decision is a deny", "package sandgate\n\ndecision := {\"allow\": true} if input.kind == \"nothing\"\n", "echo", false, policy.CodeUndefined, "data.sandgate.decision is undefined for this input", ""},
		{"runtime error is a deny", "package sandgate\n\ndecision := {\"allow\": to_number(input.mcp.tool) > 0}\n", "echo", false, policy.CodeEvalError, "", ""},
		{"conflicting rule values are a deny", "package sandgate\n\ndecision := {\"allow\": true} if true\n\ndecision := {\"allow\": false} if true\n", "echo", false, policy.CodeEvalError, "", ""},
		{"a result that is not an object is a deny", "package sandgate\n\ndecision := true\n", "echo", false, policy.CodeBadResult, "", ""},
		{"allow that is not a boolean is a deny", "package sandgate\n\ndecision := {\"allow\": \"yes\"}\n", "echo", false, policy.CodeBadResult, "", ""},
		{"allow without reason gets a default reason", "package sandgate\n\ndecision := {\"allow\": true}\n", "echo", true, policy.CodePolicyAllow, "allowed by policy", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, _ := newEngine(t, map[string]string{"p.rego": tc.policy})
			d := e.Decide(context.Background(), callInput(tc.tool))
			assert.Equal(t, tc.wantAllow, d.Allow, "reason: %s", d.Reason)
			assert.Equal(t, tc.wantCode, d.Code)
			if tc.wantReason != "" {
				assert.Equal(t, tc.wantReason, d.Reason)
			}
			assert.NotEmpty(t, d.Reason)
			assert.Equal(t, tc.wantCred, d.Credential)
			assert.Equal(t, e.Revision(), d.Revision)
			assert.Len(t, d.Revision, 16)
		})
	}
}

func TestInputContractIsVisibleToPolicy(t *testing.T) {
	src := `package sandgate

decision := {"allow": true, "reason": json.marshal(input)}
`
	e, _ := newEngine(t, map[string]string{"p.rego": src})
	in := &policy.Input{
		Kind:     audit.KindHTTPRequest,
		Identity: identity.Identity{Namespace: "ns", Sandbox: "sb", Template: "tpl", Claim: "c", Labels: map[string]string{"team": "a"}, SourceIP: "127.0.0.2", Known: true},
		HTTP:     &policy.HTTP{Method: "POST", Host: "api.anthropic.com", Port: 443, Path: "/v1/messages", Route: "anthropic", Model: "m", MaxTokens: 100, Stream: true},
		Grants:   map[string]any{"github_repos": []any{"acme/api"}},
		Usage:    map[string]int64{"tokens_today": 5},
	}
	d := e.Decide(context.Background(), in)
	require.True(t, d.Allow)
	assert.JSONEq(t, `{
		"kind": "http.request",
		"identity": {"namespace": "ns", "sandbox": "sb", "template": "tpl", "claim": "c", "labels": {"team": "a"}, "source_ip": "127.0.0.2", "known": true},
		"http": {"method": "POST", "host": "api.anthropic.com", "port": 443, "path": "/v1/messages", "route": "anthropic", "model": "m", "max_tokens": 100, "stream": true},
		"grants": {"github_repos": ["acme/api"]},
		"usage": {"tokens_today": 5}
	}`, d.Reason)
}

func TestMissingPolicyDenies(t *testing.T) {
	t.Run("empty folder serves and denies everything", func(t *testing.T) {
		e, err := policy.New(context.Background(), t.TempDir())
		require.NoError(t, err)
		d := e.Decide(context.Background(), callInput("echo"))
		assert.False(t, d.Allow)
		assert.Equal(t, policy.CodeNoPolicy, d.Code)
		assert.Equal(t, "none", d.Revision)
	})
	t.Run("folder that does not exist is an error", func(t *testing.T) {
		_, err := policy.New(context.Background(), filepath.Join(t.TempDir(), "nope"))
		require.Error(t, err)
	})
	t.Run("policies without a decision rule are rejected", func(t *testing.T) {
		dir := t.TempDir()
		writePolicy(t, dir, "p.rego", "package other\n\nx := 1\n")
		_, err := policy.New(context.Background(), dir)
		require.ErrorContains(t, err, "define no data.sandgate.decision rule")
	})
	t.Run("compile error names file and line", func(t *testing.T) {
		dir := t.TempDir()
		writePolicy(t, dir, "broken.rego", "package sandgate\n\ndecision := {\"allow\": undefined_var}\n")
		_, err := policy.New(context.Background(), dir)
		require.ErrorContains(t, err, "broken.rego:3")
	})
}

func TestReload(t *testing.T) {
	var results []policy.ReloadResult
	e, dir := newEngine(t, map[string]string{"p.rego": allowEcho}, policy.WithReloadObserver(func(r policy.ReloadResult) { results = append(results, r) }))
	first := e.Revision()
	ctx := context.Background()

	writePolicy(t, dir, "p.rego", "package sandgate\n\ndecision := {\"allow\": \n")
	require.Error(t, e.Reload(ctx), "a policy that does not parse is rejected")
	assert.Equal(t, first, e.Revision(), "the last good revision keeps serving")
	assert.True(t, e.Decide(ctx, callInput("echo")).Allow)

	writePolicy(t, dir, "p.rego", "package sandgate\n\ndecision := {\"allow\": false, \"reason\": \"locked down\"}\n")
	require.NoError(t, e.Reload(ctx))
	assert.NotEqual(t, first, e.Revision(), "a good reload changes the revision")
	d := e.Decide(ctx, callInput("echo"))
	assert.False(t, d.Allow)
	assert.Equal(t, e.Revision(), d.Revision)

	second := e.Revision()
	require.NoError(t, e.Reload(ctx))
	assert.Equal(t, second, e.Revision(), "unchanged files keep the revision")

	writePolicy(t, dir, "data.json", `{"limits": {"x": 1}}`)
	require.NoError(t, e.Reload(ctx))
	assert.NotEqual(t, second, e.Revision(), "a data file change is a new revision")

	require.Len(t, results, 5)
	assert.Error(t, results[1].Err)
	assert.False(t, results[1].Changed)
	assert.True(t, results[2].Changed)
	assert.False(t, results[3].Changed)
}

func TestWatchReloadsOnChange(t *testing.T) {
	dir := t.TempDir()
	writePolicy(t, dir, "p.rego", allowEcho)
	w := startWatch(t, dir)
	first := w.Revision()

	writePolicy(t, dir, "p.rego", "package sandgate\n\ndecision := {\"allow\": 1 +\n")
	w.waitFor(t, "the broken edit to be rejected", func() bool { return w.Status().ReloadErr != nil })
	assert.Equal(t, first, w.Revision(), "a broken edit leaves the last good revision")

	writePolicy(t, dir, "p.rego", "package sandgate\n\ndecision := {\"allow\": false}\n")
	w.waitFor(t, "the repaired edit to be served", func() bool { return w.Revision() != first })
	assert.False(t, w.Decide(context.Background(), callInput("echo")).Allow)
}

func TestTestFilesAreNotServed(t *testing.T) {
	e, _ := newEngine(t, map[string]string{
		"p.rego":      allowEcho,
		"p_test.rego": "package sandgate\n\ntest_x if true\n\ndecision := {\"allow\": true} if input.mcp.tool == \"rm\"\n",
	})
	assert.False(t, e.Decide(context.Background(), callInput("rm")).Allow)
}

func TestShippedPolicies(t *testing.T) {
	ctx := context.Background()
	e, err := policy.New(ctx, "../policies")
	require.NoError(t, err)
	coder := identity.Identity{Namespace: "agents", Sandbox: "sb-1", Template: "coding-agent", Known: true}
	triage := identity.Identity{Namespace: "agents", Sandbox: "sb-2", Template: "triage-agent", Known: true}
	model := func(id identity.Identity, m string, max int64) policy.Decision {
		return e.Decide(ctx, &policy.Input{Kind: audit.KindHTTPRequest, Identity: id,
			HTTP: &policy.HTTP{Method: "POST", Host: "api.anthropic.com", Port: 443, Path: "/v1/messages", Route: "anthropic", Model: m, MaxTokens: max}})
	}
	d := model(coder, "claude-sonnet-4-5", 1000)
	assert.True(t, d.Allow, d.Reason)
	assert.Equal(t, "anthropic", d.Credential)
	assert.False(t, model(triage, "claude-sonnet-4-5", 1000).Allow)
	assert.False(t, model(triage, "claude-haiku-4-5", 5000).Allow)
	anon := e.Decide(ctx, &policy.Input{Kind: audit.KindToolsCall, Identity: identity.Anonymous(netipAddr(t, "127.0.0.9")), MCP: &policy.MCP{Upstream: "everything", Tool: "echo"}})
	assert.False(t, anon.Allow)
	assert.Equal(t, "unknown_identity", anon.Code)

	sum, err := policy.RunTests(ctx, io.Discard, false, "../policies")
	require.NoError(t, err)
	assert.True(t, sum.OK(), "%+v", sum)
	assert.Greater(t, sum.Passed, 20)
}

func TestRunTestsReportsFailures(t *testing.T) {
	dir := t.TempDir()
	writePolicy(t, dir, "p.rego", allowEcho)
	writePolicy(t, dir, "p_test.rego", "package sandgate_test\n\ntest_echo_allowed if data.sandgate.decision.allow with input as {\"mcp\": {\"tool\": \"echo\"}}\n\ntest_wrong if data.sandgate.decision.allow with input as {\"mcp\": {\"tool\": \"rm\"}}\n")
	sum, err := policy.RunTests(context.Background(), io.Discard, false, dir)
	require.NoError(t, err)
	assert.Equal(t, 1, sum.Passed)
	assert.Equal(t, 1, sum.Failed)
	assert.False(t, sum.OK())
}

func BenchmarkDecideShippedPolicy(b *testing.B) {
	ctx := context.Background()
	cases := map[string]*policy.Input{
		"tools_call": {Kind: audit.KindToolsCall, Identity: identity.Identity{Namespace: "agents", Sandbox: "sb-1", Template: "coding-agent", SourceIP: "127.0.0.2", Known: true, Labels: map[string]string{}},
			MCP:    &policy.MCP{Upstream: "github", Tool: "create_pull_request", Arguments: map[string]any{"owner": "acme", "repo": "api", "title": "fix"}},
			Grants: map[string]any{"github_repos": []any{"acme/api"}}},
		"model_request": {Kind: audit.KindHTTPRequest, Identity: identity.Identity{Namespace: "agents", Sandbox: "sb-1", Template: "coding-agent", SourceIP: "127.0.0.2", Known: true, Labels: map[string]string{}},
			HTTP: &policy.HTTP{Method: "POST", Host: "api.anthropic.com", Port: 443, Path: "/v1/messages", Route: "anthropic", Model: "claude-sonnet-4-5", MaxTokens: 1024}},
	}
	// "evaluated" runs OPA for every decision (the cache off); "cached" is the default engine,
	// where a repeated input is answered by the revision's decision cache.
	for _, mode := range []struct {
		name    string
		entries int
	}{{"evaluated", 0}, {"cached", policy.DefaultCacheEntries}} {
		e, err := policy.New(ctx, "../policies", policy.WithDecisionCache(mode.entries))
		require.NoError(b, err)
		for name, in := range cases {
			b.Run(mode.name+"/"+name, func(b *testing.B) {
				require.True(b, e.Decide(ctx, in).Allow)
				b.ReportAllocs()
				for b.Loop() {
					if !e.Decide(ctx, in).Allow {
						b.Fatal("denied")
					}
				}
			})
		}
	}
}
