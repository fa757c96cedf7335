//go:build linux

package policy_test

import (
	"context"
	"os"
	"testing"

	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

// oneLineFloor is the floor of a first-seen decision: OPA's own prepared evaluation of a policy
// of one rule reading the input (the same as bench/policybench.go's baseline).
const oneLineFloor = "package floor\n\nallow if input.kind != \"\"\n"

// firstSeenCases are bench/policybench.go's inputs: the allow path of a model request and of a
// grant-scoped tools/call on the shipped policies.
func firstSeenCases() []struct {
	name string
	in   *policy.Input
} {
	id := identity.Identity{Namespace: "agents", Sandbox: "sb-1", Template: "coding-agent", SourceIP: "127.0.0.2", Known: true}
	return []struct {
		name string
		in   *policy.Input
	}{
		{"model_request", &policy.Input{Kind: audit.KindHTTPRequest, Identity: id, HTTP: &policy.HTTP{Method: "POST", Host: "api.anthropic.com",
			Port: 443, Path: "/v1/messages", Route: "anthropic", Model: "claude-sonnet-4-5", MaxTokens: 1024}}},
		{"tools_call", &policy.Input{Kind: audit.KindToolsCall, Identity: id, Grants: map[string]any{"github_repos": []any{"acme/api"}},
			MCP: &policy.MCP{Upstream: "github", Tool: "create_pull_request", Arguments: map[string]any{"owner": "acme", "repo": "api", "title": "fix"}}}},
	}
}

// BenchmarkFirstSeenVsFloor is issue #23's policy target in one run. For each case:
//   - floor: OPA's own rego.PreparedEvalQuery of oneLineFloor on the input built by Input.Value,
//     the way Sandgate builds it;
//   - shipped: the shipped policies through Engine.Decide with the decision cache off (an
//     input seen for the first time);
//   - ratio: both, alternating a few ops at a time, each arm's turns timed by the process's CPU
//     clock (CLOCK_PROCESS_CPUTIME_ID: nanoseconds run by every thread, the evaluation worker
//     and the garbage collector included, not time spent waiting for a core); it reports
//     x-floor, shipped CPU over floor CPU. On this shared 2-core box consecutive wall-clock runs
//     of the same code differ by 2–5×; CPU time interleaved in small turns does not.
//
// With -count N every repetition gives one x-floor; `make bench-policy` prints the medians.
// Target: x-floor ≤ 1.5 for every case. For an A/B of a policy edit, set
// SANDGATE_BENCH_POLICIES_B to another policy folder (the old policies, say): ratio then
// interleaves it too and reports its ratio as b-x-floor.
func BenchmarkFirstSeenVsFloor(b *testing.B) {
	ctx := context.Background()
	engine := func(dir string) *policy.Engine {
		e, err := policy.New(ctx, dir, policy.WithDecisionCache(0))
		require.NoError(b, err)
		return e
	}
	shipped, other := engine("../policies"), (*policy.Engine)(nil)
	if dir := os.Getenv("SANDGATE_BENCH_POLICIES_B"); dir != "" {
		other = engine(dir)
	}
	pq, err := rego.New(rego.Query("data.floor.allow"), rego.Module("floor.rego", oneLineFloor)).PrepareForEval(ctx)
	require.NoError(b, err)
	for _, c := range firstSeenCases() {
		floor := func() bool {
			v, err := c.in.Value()
			if err != nil {
				return false
			}
			rs, err := pq.Eval(ctx, rego.EvalParsedInput(v))
			return err == nil && rs.Allowed()
		}
		arms := []policy.BenchArm{{Name: "floor", Op: floor}, {Name: "shipped", Op: func() bool { return shipped.Decide(ctx, c.in).Allow }}}
		if other != nil {
			arms = append(arms, policy.BenchArm{Name: "b", Op: func() bool { return other.Decide(ctx, c.in).Allow }})
		}
		for _, a := range arms {
			require.True(b, a.Op(), a.Name)
			b.Run(c.name+"/"+a.Name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					a.Op()
				}
			})
		}
		b.Run(c.name+"/ratio", func(b *testing.B) { policy.Interleave(b, arms) })
	}
}
