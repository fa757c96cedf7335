package policy_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

// The cache must never answer with a decision the policy would not make for this input.
func TestDecisionCacheAgreesWithEvaluation(t *testing.T) {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	cached, err := policy.New(ctx, "../policies", policy.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	require.NoError(t, err)
	plain, err := policy.New(ctx, "../policies", policy.WithDecisionCache(0))
	require.NoError(t, err)

	pick := func(r *rand.Rand, xs ...string) string { return xs[r.IntN(len(xs))] }
	r := rand.New(rand.NewPCG(1, 2))
	allowed, denied := 0, 0
	var inputs []*policy.Input
	for i := range 3000 {
		in := &policy.Input{Identity: identity.Identity{
			Namespace: "agents", Sandbox: fmt.Sprintf("sb-%d", r.IntN(50)), SourceIP: "127.0.0.2",
			Template: pick(r, "coding-agent", "triage-agent", "nope", ""), Known: r.IntN(10) > 0,
		}}
		if r.IntN(2) == 0 {
			in.Kind = audit.Kind(pick(r, string(audit.KindToolsCall), string(audit.KindToolsList), string(audit.KindResourcesRead), string(audit.KindPromptsGet)))
			in.MCP = &policy.MCP{Upstream: pick(r, "github", "jira", "db"), Tool: pick(r, "create_pull_request", "get_issue", "search_code", "delete_repo", "query"),
				Arguments: map[string]any{"owner": pick(r, "acme", "evil"), "repo": pick(r, "api", "web"), "title": fmt.Sprint(i)}}
			in.Grants = map[string]any{"github_repos": []any{pick(r, "acme/api", "acme/web")}}
		} else {
			in.Kind = audit.Kind(pick(r, string(audit.KindHTTPRequest), string(audit.KindHTTPConnect)))
			in.HTTP = &policy.HTTP{Method: "POST", Host: pick(r, "api.anthropic.com", "api.openai.com", "evil.example", "github.com"), Port: 443,
				Path: "/v1/messages", Route: pick(r, "", "anthropic", "openai"), Model: pick(r, "claude-sonnet-4-5", "claude-opus-4", "gpt-5", ""),
				MaxTokens: []int64{-1, 1024, 8192, 64000}[r.IntN(4)], Stream: r.IntN(2) == 0}
		}
		in.Usage = map[string]int64{"requests_per_minute": int64(i)}
		inputs = append(inputs, in)
		got, want := cached.Decide(ctx, in), plain.Decide(ctx, in)
		require.Equal(t, want, got, "input %d: %+v", i, in)
		if want.Allow {
			allowed++
		} else {
			denied++
		}
	}
	assert.Greater(t, allowed, 100, "the table exercises allowed calls")
	assert.Greater(t, denied, 100, "the table exercises denied calls")
	for i, in := range inputs { // every answer of this round comes from the cache
		require.Equal(t, plain.Decide(ctx, in), cached.Decide(ctx, in), "input %d again: %+v", i, in)
	}

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	lookups := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == "sandgate.policy.decision_cache.lookups" {
				for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
					v, _ := dp.Attributes.Value("result")
					lookups[v.AsString()] += dp.Value
				}
			}
		}
	}
	assert.Equal(t, int64(6000), lookups["hit"]+lookups["miss"])
	assert.GreaterOrEqual(t, lookups["hit"], int64(3000))
}

// Each policy reads one part of input the way a policy author might; the first call is
// allowed and cached, the second differs only in that part and must be denied.
func TestDecisionCacheSeesWhatThePolicyReads(t *testing.T) {
	base := func() *policy.Input {
		return &policy.Input{Kind: audit.KindToolsCall,
			Identity: identity.Identity{Namespace: "agents", Sandbox: "sb", Template: "t", Known: true, Labels: map[string]string{"team": "a"}},
			MCP:      &policy.MCP{Upstream: "u", Tool: "echo", Arguments: map[string]any{"path": "/work/x", "n": 1.0}},
			Usage:    map[string]int64{"requests_per_minute": 1}}
	}
	cases := []struct {
		name   string
		rule   string
		change func(*policy.Input)
	}{
		{"usage", `decision := {"allow": input.usage.requests_per_minute < 10}`,
			func(in *policy.Input) { in.Usage["requests_per_minute"] = 50 }},
		{"the sandbox's name", `decision := {"allow": input.identity.sandbox == "sb"}`,
			func(in *policy.Input) { in.Identity.Sandbox = "sb-2" }},
		{"a label under a dynamic key", `decision := {"allow": true} if { some k; input.identity.labels[k] == "a" }`,
			func(in *policy.Input) { in.Identity.Labels["team"] = "b" }},
		{"input handed whole to a builtin", `decision := {"allow": object.get(input, ["mcp", "arguments", "path"], "") == "/work/x"}`,
			func(in *policy.Input) { in.MCP.Arguments["path"] = "/etc/passwd" }},
		{"input bound to a variable", `decision := {"allow": x.mcp.arguments.n == 1} if x := input`,
			func(in *policy.Input) { in.MCP.Arguments["n"] = 2.0 }},
		{"an argument read inside a function", `decision := {"allow": ok(input.mcp)}
			ok(m) if startswith(m.arguments.path, "/work/")`,
			func(in *policy.Input) { in.MCP.Arguments["path"] = "/etc/passwd" }},
		{"an argument that becomes undefined", `decision := {"allow": true} if input.mcp.arguments.path
			default decision := {"allow": false}`,
			func(in *policy.Input) { delete(in.MCP.Arguments, "path") }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, _ := newEngine(t, map[string]string{"p.rego": "package sandgate\n" + tc.rule})
			ctx := context.Background()
			for range 2 { // the second answer comes from the cache
				require.True(t, e.Decide(ctx, base()).Allow)
			}
			in := base()
			tc.change(in)
			d := e.Decide(ctx, in)
			assert.False(t, d.Allow, "a cached allow was served for a changed input (%s)", d.Reason)
		})
	}
}

func TestNondeterministicPolicyIsEvaluatedEveryTime(t *testing.T) {
	e, _ := newEngine(t, map[string]string{"p.rego": `package sandgate
decision := {"allow": rand.intn("coin", 2) == 0}`})
	seen := map[bool]int{}
	for range 200 {
		seen[e.Decide(context.Background(), callInput("echo")).Allow]++
	}
	assert.Positive(t, seen[true])
	assert.Positive(t, seen[false], "every decision is a fresh coin flip, not a cached one")
}

func TestEngineDenialsAreNotCached(t *testing.T) {
	e, _ := newEngine(t, map[string]string{"p.rego": allowEcho})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	d := e.Decide(ctx, callInput("echo"))
	require.False(t, d.Allow)
	require.Equal(t, policy.CodeEvalError, d.Code)
	assert.True(t, e.Decide(context.Background(), callInput("echo")).Allow, "an abandoned evaluation is not remembered")
}

func TestDecisionCacheStartsOverWhenFull(t *testing.T) {
	e, _ := newEngine(t, map[string]string{"p.rego": allowEcho}, policy.WithDecisionCache(2))
	for i := range 20 {
		tool := fmt.Sprintf("t%d", i%5)
		if i%5 == 0 {
			tool = "echo"
		}
		assert.Equal(t, tool == "echo", e.Decide(context.Background(), callInput(tool)).Allow, tool)
	}
}

// A context that is done before evaluation starts is denied with CodeEvalError every time: not
// evaluated by a worker that happened to be free, and not answered from the cache either.
func TestEngineDeniesADoneContextEveryTime(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	for _, tc := range []struct {
		name    string
		entries int
	}{
		{"with the allow already cached", policy.DefaultCacheEntries},
		{"with the cache off, at the hand-off to a worker", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, _ := newEngine(t, map[string]string{"p.rego": allowEcho}, policy.WithDecisionCache(tc.entries))
			require.True(t, e.Decide(context.Background(), callInput("echo")).Allow)
			for i := range 2000 {
				ctx := cancelled
				if i%2 == 1 {
					ctx = expired
				}
				d := e.Decide(ctx, callInput("echo"))
				if d.Allow || d.Code != policy.CodeEvalError || d.Revision != e.Revision() {
					t.Fatalf("iteration %d: done context got allow=%v code=%q revision=%q, want a %s deny of %s", i, d.Allow, d.Code, d.Revision, policy.CodeEvalError, e.Revision())
				}
			}
			d := e.DecideDocument(cancelled, map[string]any{"mcp": map[string]any{"tool": "echo"}})
			assert.Equal(t, policy.CodeEvalError, d.Code, "DecideDocument keeps the same contract")
			assert.True(t, e.Decide(context.Background(), callInput("echo")).Allow, "a live context is still answered")
		})
	}
}
