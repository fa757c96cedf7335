package proxy

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Many routed requests share a few pooled upstream connections, and the pool's size is visible
// as sandgate.proxy.upstream.connections{upstream}.
func TestUpstreamPoolConnectionsAreCounted(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	h := newHarnessWith(t, func(o *Options) { o.Meters = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)) })
	c := h.client(t, "127.0.0.1")
	for range 20 {
		resp, err := c.Post("http://"+h.addr+"/routes/anthropic/v1/messages", "application/json",
			strings.NewReader(`{"model":"claude-haiku-4-5","max_tokens":100,"messages":[]}`))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	open := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "sandgate.proxy.upstream.connections" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				name, _ := dp.Attributes.Value("upstream")
				open[name.AsString()] += dp.Value
			}
		}
	}
	assert.GreaterOrEqual(t, open["anthropic"], int64(1), "the route's pool holds a connection: %v", open)
	assert.LessOrEqual(t, open["anthropic"], int64(2), "20 requests reuse pooled connections: %v", open)
}
