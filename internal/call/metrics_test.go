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

	runCall(context.Background(), core, audit.KindHTTPRequest, id, call.Question{Input: &policy.Input{Kind: audit.KindHTTPRequest, Identity: id}}, nil)
	core.Reject(context.Background(), audit.KindMCPRejected, id, audit.Target{}, call.Refuse(call.CodeSessionNotOwned, "hijack"))
	for i := range 10000 {
		runCall(context.Background(), core, audit.KindSetLevel, id, call.Question{}, func(cl *call.Call, _ call.Grant) call.End {
			cl.Note(fmt.Sprintf("logging/setLevel: invalid logging level 'minted-%d'", i))
			return call.Answered(200)
		})
	}
	assert.ElementsMatch(t, []string{"model_not_allowed", call.CodeSessionNotOwned, "other"}, codesOf(t, reader))
}
