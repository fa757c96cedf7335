package call_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

type discardRecorder struct{}

func (discardRecorder) Record(*audit.Event) error { return nil }
func (discardRecorder) Healthy() error            { return nil }

// codesOf is the code label of every sandgate.calls series.
func codesOf(t *testing.T, reader *sdkmetric.ManualReader) []string {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	var codes []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "sandgate.calls" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				v, _ := dp.Attributes.Value(attribute.Key("code"))
				codes = append(codes, v.AsString())
			}
		}
	}
	return codes
}

// The code label takes Sandgate's codes and a policy's as they are, and everything else
// (texts an upstream or mcp-go chose) as "other": 10,000 distinct error texts add one series.
func TestCallCodeLabelsAreAClosedSet(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	core, err := call.New(call.Options{Audit: discardRecorder{}, Meters: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
		Policy: fixedDecider{policy.Decision{Allow: false, Reason: "no", Code: "model_not_allowed", Revision: "r1"}}})
	require.NoError(t, err)
	id := identity.Identity{Namespace: "ns", Sandbox: "sb", Known: true}

	ctx, cl := core.Begin(context.Background(), audit.KindHTTPRequest, id)
	_, rf := cl.Authorize(ctx, &policy.Input{Kind: audit.KindHTTPRequest, Identity: id}, false)
	cl.Refuse(rf)
	_, cl = core.Begin(context.Background(), audit.KindMCPRejected, id)
	cl.Refuse(call.Refuse(call.CodeSessionNotOwned, "hijack"))
	for i := range 10000 {
		_, cl := core.Begin(context.Background(), audit.KindSetLevel, id)
		cl.Note(fmt.Sprintf("logging/setLevel: invalid logging level 'minted-%d'", i))
		cl.Finish()
	}
	assert.ElementsMatch(t, []string{"model_not_allowed", call.CodeSessionNotOwned, "other"}, codesOf(t, reader))
}
