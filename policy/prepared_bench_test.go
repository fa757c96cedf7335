//go:build linux

package policy

import (
	"context"
	"testing"

	"github.com/open-policy-agent/opa/v1/metrics"
	"github.com/open-policy-agent/opa/v1/rego"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
)

// BenchmarkPreparedEvalVsTopdown answers why decisions drive topdown directly (load.go): the
// shipped policies' revision evaluated on the same input through rego.PreparedEvalQuery (the
// API OPA's users call, given the revision's compiler, store and data cache and no metrics, so
// only the API differs) and through revision.decide,
// interleaved; prepared-x-floor is the prepared path's CPU over the direct path's. Both include
// building the input (Input.Value) and neither runs on the stack pool.
func BenchmarkPreparedEvalVsTopdown(b *testing.B) {
	ctx := context.Background()
	e, err := New(ctx, "../policies", WithDecisionCache(0))
	require.NoError(b, err)
	rev := e.cur.Load()
	pq, err := rego.New(rego.Query(Query), rego.Compiler(rev.compiler), rego.Store(rev.store)).PrepareForEval(ctx)
	require.NoError(b, err)
	id := identity.Identity{Namespace: "agents", Sandbox: "sb-1", Template: "coding-agent", SourceIP: "127.0.0.2", Known: true}
	in := &Input{Kind: audit.KindHTTPRequest, Identity: id, HTTP: &HTTP{Method: "POST", Host: "api.anthropic.com",
		Port: 443, Path: "/v1/messages", Route: "anthropic", Model: "claude-sonnet-4-5", MaxTokens: 1024}}
	direct := func() bool {
		v, err := in.Value()
		return err == nil && rev.decide(ctx, v).Allow
	}
	prepared := func() bool {
		v, err := in.Value()
		if err != nil {
			return false
		}
		rs, err := pq.Eval(ctx, rego.EvalParsedInput(v), rego.EvalBaseCache(&rev.data), rego.EvalMetrics(metrics.NoOp()))
		if err != nil || len(rs) != 1 {
			return false
		}
		// The result set holds the decision as Go values (OPA converts it back from the AST).
		d, _ := rs[0].Expressions[0].Value.(map[string]any)
		return d["allow"] == true
	}
	require.True(b, direct())
	require.True(b, prepared())
	Interleave(b, []BenchArm{{Name: "topdown", Op: direct}, {Name: "prepared", Op: prepared}})
}
