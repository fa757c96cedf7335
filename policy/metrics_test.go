package policy_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

// Every decision is counted by kind, allow and code, and timed under the same attributes, hit
// or miss: the counts are the decisions made.
func TestDecisionMetrics(t *testing.T) {
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	e, err := policy.New(ctx, "../policies", policy.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	require.NoError(t, err)
	known := identity.Identity{Namespace: "agents", Sandbox: "sb-1", Template: "coding-agent", Known: true, Labels: map[string]string{"team": "core"}}
	allowed := &policy.Input{Kind: audit.KindToolsCall, Identity: known, MCP: &policy.MCP{Upstream: "everything", Tool: "echo"}}
	anon := &policy.Input{Kind: audit.KindToolsList, Identity: identity.Anonymous(netipAddr(t, "127.0.0.9")), MCP: &policy.MCP{Upstream: "everything", Tool: "echo"}}
	for range 5 {
		require.True(t, e.Decide(ctx, allowed).Allow)
	}
	for range 3 {
		d := e.Decide(ctx, anon)
		require.False(t, d.Allow)
		require.Equal(t, "unknown_identity", d.Code)
	}
	allowCode := e.Decide(ctx, allowed).Code

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	series := func(kind string, allow bool, code string) attribute.Distinct {
		s := attribute.NewSet(attribute.String("kind", kind), attribute.Bool("allow", allow), attribute.String("code", code))
		return s.Equivalent()
	}
	counts, timed := map[attribute.Distinct]int64{}, map[attribute.Distinct]uint64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch m.Name {
			case "sandgate.policy.decisions":
				sum := m.Data.(metricdata.Sum[int64])
				assert.True(t, sum.IsMonotonic)
				assert.Equal(t, metricdata.CumulativeTemporality, sum.Temporality)
				for _, dp := range sum.DataPoints {
					counts[dp.Attributes.Equivalent()] += dp.Value
				}
				assert.Len(t, sum.DataPoints, 2, "one series per (kind, allow, code)")
			case "sandgate.policy.evaluation.duration":
				h := m.Data.(metricdata.Histogram[float64])
				for _, dp := range h.DataPoints {
					timed[dp.Attributes.Equivalent()] += dp.Count
					assert.Equal(t, []float64{5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2.5e-4, 1e-3, 1e-2}, dp.Bounds)
				}
				assert.Equal(t, "s", m.Unit)
			}
		}
	}
	ok, denied := series("mcp.tools_call", true, allowCode), series("mcp.tools_list", false, "unknown_identity")
	assert.Equal(t, map[attribute.Distinct]int64{ok: 6, denied: 3}, counts)
	assert.Equal(t, map[attribute.Distinct]uint64{ok: 6, denied: 3}, timed)
}
