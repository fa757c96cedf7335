package bench

import (
	"context"
	"fmt"
	"testing"

	"github.com/open-policy-agent/opa/v1/rego"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

// PolicyFigure is one in-process Go benchmark of a policy decision on the shipped policies
// (their own data), the same measurement as `go test -bench DecideShippedPolicy ./policy/`.
type PolicyFigure struct {
	Case string `json:"case"` // model_request, tools_call
	// Mode is "evaluated" (OPA runs, as for an input seen for the first time), "cached" (a
	// repeated input, answered by the revision's decision cache) or "baseline" (OPA's own
	// prepared evaluation of a one-line policy on the same input: the floor of "evaluated").
	Mode        string  `json:"mode"`
	Round       int     `json:"round"`
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

// policyRounds is how many times each figure is measured, the floor right after the shipped
// policies each time, so that the ratio of the two is taken per round (a loaded machine moves
// ns/op between rounds far more than between two adjacent benchmarks).
const policyRounds = 3

// benchPolicy measures both cases in both modes on the policy folder dir, and the floor.
func benchPolicy(ctx context.Context, dir string) ([]PolicyFigure, error) {
	engines := map[string]*policy.Engine{}
	for mode, entries := range map[string]int{"evaluated": 0, "cached": policy.DefaultCacheEntries} {
		e, err := policy.New(ctx, dir, policy.WithDecisionCache(entries))
		if err != nil {
			return nil, fmt.Errorf("policy benchmark: %w", err)
		}
		engines[mode] = e
	}
	var out []PolicyFigure
	for round := range policyRounds {
		for _, name := range []string{"model_request", "tools_call"} {
			in := policyBenchInputs()[name]
			for _, mode := range []string{"evaluated", "cached"} {
				e := engines[mode]
				if d := e.Decide(ctx, in); !d.Allow {
					return nil, fmt.Errorf("policy benchmark: the shipped policies deny the %s case: %s", name, d.Reason)
				}
				r := testing.Benchmark(func(b *testing.B) {
					for b.Loop() {
						e.Decide(ctx, in)
					}
				})
				out = append(out, PolicyFigure{Case: name, Mode: mode, Round: round, NsPerOp: float64(r.NsPerOp()), AllocsPerOp: r.AllocsPerOp()})
			}
			f, err := benchOneLinePolicy(ctx, name, in)
			if err != nil {
				return nil, err
			}
			f.Round = round
			out = append(out, f)
		}
	}
	return out, nil
}

// oneLinePolicy is the floor of a first-seen decision: one rule reading the input.
const oneLinePolicy = "package floor\n\nallow if input.kind != \"\"\n"

// benchOneLinePolicy measures OPA's own evaluation (rego.PreparedEvalQuery, the API OPA users
// call) of oneLinePolicy on the same input as the shipped-policy case, built the way Sandgate
// builds it for every decision (Input.Value), so the two differ by the policy only.
func benchOneLinePolicy(ctx context.Context, name string, in *policy.Input) (PolicyFigure, error) {
	pq, err := rego.New(rego.Query("data.floor.allow"), rego.Module("floor.rego", oneLinePolicy)).PrepareForEval(ctx)
	if err != nil {
		return PolicyFigure{}, fmt.Errorf("policy benchmark floor: %w", err)
	}
	eval := func() (rego.ResultSet, error) {
		v, err := in.Value()
		if err != nil {
			return nil, err
		}
		return pq.Eval(ctx, rego.EvalParsedInput(v))
	}
	if rs, err := eval(); err != nil || !rs.Allowed() {
		return PolicyFigure{}, fmt.Errorf("policy benchmark floor: the one-line policy did not allow %s (%v)", name, err)
	}
	r := testing.Benchmark(func(b *testing.B) {
		for b.Loop() {
			_, _ = eval()
		}
	})
	return PolicyFigure{Case: name, Mode: "baseline", NsPerOp: float64(r.NsPerOp()), AllocsPerOp: r.AllocsPerOp()}, nil
}
