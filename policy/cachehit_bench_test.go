package policy_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

// labelsPolicy reads the sandbox's labels whole (a dynamic key), so its cache key holds
// input.identity.labels.
const labelsPolicy = `package sandgate

decision := {"allow": true} if {
	input.kind == "mcp.tools_call"
	input.identity.template == "coding-agent"
	some k
	input.identity.labels[k] == "core"
	input.mcp.tool == "create_pull_request"
}
`

// BenchmarkDecideCacheHit is the gateway's steady state: every decision a cache hit, for a
// sandbox whose pod carries labels, with the shipped policies (with and without metrics) and
// with a policy that reads the labels.
func BenchmarkDecideCacheHit(b *testing.B) {
	ctx := context.Background()
	id := identity.Identity{Namespace: "agents", Sandbox: "sb-1", Template: "coding-agent", Claim: "claim-1", SourceIP: "127.0.0.2", Known: true,
		Labels: map[string]string{"team": "core", "app.kubernetes.io/name": "sandbox", "agents.x-k8s.io/sandbox-name-hash": "5d41402a", "tier": "dev"}}
	mcp := &policy.MCP{Upstream: "github", Tool: "create_pull_request", Arguments: map[string]any{"owner": "acme", "repo": "api", "title": "fix"}}
	grants := map[string]any{"github_repos": []any{"acme/api"}}
	inputs := map[string]*policy.Input{
		"tools_list": {Kind: audit.KindToolsList, Identity: id, MCP: &policy.MCP{Upstream: "github", Tool: "create_pull_request"}, Grants: grants},
		"tools_call": {Kind: audit.KindToolsCall, Identity: id, MCP: mcp, Grants: grants},
		"model_request": {Kind: audit.KindHTTPRequest, Identity: id,
			HTTP: &policy.HTTP{Method: "POST", Host: "api.anthropic.com", Port: 443, Path: "/v1/messages", Route: "anthropic", Model: "claude-sonnet-4-5", MaxTokens: 1024}},
	}
	labelsDir := b.TempDir()
	writeFiles(b, labelsDir, map[string]string{"p.rego": labelsPolicy})
	metered := policy.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())))
	for _, bc := range []struct {
		name, dir string
		opts      []policy.Option
		inputs    []string
	}{
		{"shipped", "../policies", nil, []string{"tools_list", "tools_call", "model_request"}},
		{"shipped+metrics", "../policies", []policy.Option{metered}, []string{"tools_call"}},
		{"labels", labelsDir, nil, []string{"tools_call"}},
	} {
		e, err := policy.New(ctx, bc.dir, bc.opts...)
		require.NoError(b, err)
		for _, name := range bc.inputs {
			in := inputs[name]
			b.Run(bc.name+"/"+name, func(b *testing.B) {
				want := e.Decide(ctx, in)
				require.True(b, want.Allow, want.Reason)
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
