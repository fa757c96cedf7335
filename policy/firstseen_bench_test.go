package policy_test

import (
	"context"
	"testing"
	"time"

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
//   - ratio: both, alternating op by op on the same goroutine, each timed on its own; it reports
//     x-floor, shipped time over floor time. Interleaving op by op keeps the ratio steady on a
//     busy machine where consecutive runs of the same code differ by 2×.
//
// With -count N every repetition gives one x-floor; `make bench-policy` prints the medians.
// Target: x-floor ≤ 1.5 for every case.
func BenchmarkFirstSeenVsFloor(b *testing.B) {
	ctx := context.Background()
	e, err := policy.New(ctx, "../policies", policy.WithDecisionCache(0))
	require.NoError(b, err)
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
		shipped := func() bool { return e.Decide(ctx, c.in).Allow }
		require.True(b, floor())
		require.True(b, shipped())
		for _, m := range []struct {
			name string
			op   func() bool
		}{{"floor", floor}, {"shipped", shipped}} {
			b.Run(c.name+"/"+m.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					m.op()
				}
			})
		}
		b.Run(c.name+"/ratio", func(b *testing.B) {
			var inFloor, inShipped time.Duration
			i := 0
			for b.Loop() {
				first, second, d1, d2 := floor, shipped, &inFloor, &inShipped
				if i++; i%2 == 0 {
					first, second, d1, d2 = shipped, floor, &inShipped, &inFloor
				}
				t0 := time.Now()
				first()
				t1 := time.Now()
				second()
				*d1 += t1.Sub(t0)
				*d2 += time.Since(t1)
			}
			b.ReportMetric(float64(inShipped.Nanoseconds())/float64(b.N), "shipped-ns/op")
			b.ReportMetric(float64(inFloor.Nanoseconds())/float64(b.N), "floor-ns/op")
			b.ReportMetric(float64(inShipped)/float64(inFloor), "x-floor")
		})
	}
}
