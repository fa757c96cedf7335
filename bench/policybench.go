package bench

import (
	"context"
	"fmt"
	"testing"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

// PolicyFigure is one in-process Go benchmark of a policy decision on the shipped policies
// (their own data), the same measurement as `go test -bench DecideShippedPolicy ./policy/`.
type PolicyFigure struct {
	Case string `json:"case"` // model_request, tools_call
	// Mode is "evaluated" (OPA runs, as for an input seen for the first time) or "cached" (a
	// repeated input, answered by the revision's decision cache).
	Mode        string  `json:"mode"`
	NsPerOp     float64 `json:"ns_per_op"`
	AllocsPerOp int64   `json:"allocs_per_op"`
}

func policyBenchInputs() map[string]*policy.Input {
	id := identity.Identity{Namespace: "agents", Sandbox: "sb-1", Template: "coding-agent", SourceIP: "127.0.0.2", Known: true}
	return map[string]*policy.Input{
		"model_request": {Kind: audit.KindHTTPRequest, Identity: id, HTTP: &policy.HTTP{Method: "POST", Host: "api.anthropic.com",
			Port: 443, Path: "/v1/messages", Route: "anthropic", Model: "claude-sonnet-4-5", MaxTokens: 1024}},
		"tools_call": {Kind: audit.KindToolsCall, Identity: id, Grants: map[string]any{"github_repos": []any{"acme/api"}},
			MCP: &policy.MCP{Upstream: "github", Tool: "create_pull_request", Arguments: map[string]any{"owner": "acme", "repo": "api", "title": "fix"}}},
	}
}

// benchPolicy measures both cases in both modes on the policy folder dir.
func benchPolicy(ctx context.Context, dir string) ([]PolicyFigure, error) {
	var out []PolicyFigure
	for _, mode := range []struct {
		name    string
		entries int
	}{{"evaluated", 0}, {"cached", policy.DefaultCacheEntries}} {
		e, err := policy.New(ctx, dir, policy.WithDecisionCache(mode.entries))
		if err != nil {
			return nil, fmt.Errorf("policy benchmark: %w", err)
		}
		for _, name := range []string{"model_request", "tools_call"} {
			in := policyBenchInputs()[name]
			if d := e.Decide(ctx, in); !d.Allow {
				return nil, fmt.Errorf("policy benchmark: the shipped policies deny the %s case: %s", name, d.Reason)
			}
			r := testing.Benchmark(func(b *testing.B) {
				for b.Loop() {
					e.Decide(ctx, in)
				}
			})
			out = append(out, PolicyFigure{Case: name, Mode: mode.name, NsPerOp: float64(r.NsPerOp()), AllocsPerOp: r.AllocsPerOp()})
		}
	}
	return out, nil
}
