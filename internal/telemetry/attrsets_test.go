package telemetry

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

func TestAttrSetsLabelEachKeyItsOwnWay(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	c, err := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)).Meter("t").Int64Counter("calls")
	require.NoError(t, err)
	type key struct {
		kind  string
		allow bool
	}
	built := 0
	sets := NewAttrSets(func(k key) metric.MeasurementOption {
		built++
		return metric.WithAttributes(attribute.String("kind", k.kind), attribute.Bool("allow", k.allow))
	})
	for range 3 {
		c.Add(context.Background(), 1, sets.Get(key{"a", true}))
		c.Add(context.Background(), 2, sets.Get(key{"b", false}))
	}
	assert.Equal(t, 2, built, "one set per key")
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	got := map[string]int64{}
	for _, dp := range rm.ScopeMetrics[0].Metrics[0].Data.(metricdata.Sum[int64]).DataPoints {
		k, _ := dp.Attributes.Value("kind")
		a, _ := dp.Attributes.Value("allow")
		got[k.AsString()+"/"+a.String()] = dp.Value
	}
	assert.Equal(t, map[string]int64{"a/true": 3, "b/false": 6}, got)
}
