package gateway

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sandgate/sandgate/internal/config"
)

func TestToolCallSpans(t *testing.T) {
	up := startHTTPUpstream(t, "127.0.0.1:0")
	spans := tracetest.NewSpanRecorder()
	h := startGatewayWith(t, "testdata/policy", func(o *Options) {
		o.Tracer = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	}, config.Upstream{Name: "http", URL: up.URL()})
	h.waitReady(t)
	c := connectSandbox(t, h.URL(), "127.0.0.2", nil)

	tests := []struct {
		name      string
		args      map[string]any
		wantAllow bool
	}{
		{"an allowed call's span carries the identity, the upstream and the decision", map[string]any{"message": "hi"}, true},
		{"a denied call's span says so", map[string]any{"message": "forbidden"}, false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := callTool(t, c, "echo", tt.args)
			require.NoError(t, err)
			ended := toolCallSpans(spans.Ended())
			require.Len(t, ended, i+1)
			s := ended[i]
			assert.Equal(t, "mcp tools/call", s.Name())
			attrs := map[attribute.Key]attribute.Value{}
			for _, kv := range s.Attributes() {
				attrs[kv.Key] = kv.Value
			}
			assert.Equal(t, "full-2", attrs["sandgate.identity.sandbox"].AsString())
			assert.Equal(t, "test", attrs["sandgate.identity.namespace"].AsString())
			assert.Equal(t, "full", attrs["sandgate.identity.template"].AsString())
			assert.Equal(t, "http", attrs["sandgate.upstream"].AsString())
			assert.Equal(t, tt.wantAllow, attrs["sandgate.decision.allow"].AsBool())
			assert.NotEmpty(t, attrs["sandgate.decision.code"].AsString())
		})
	}

	traceID := toolCallSpans(spans.Ended())[0].SpanContext().TraceID().String()
	var upstreamSaw bool
	up.mu.Lock()
	for _, tp := range up.traceparents {
		upstreamSaw = upstreamSaw || (len(tp) > 36 && tp[3:35] == traceID)
	}
	up.mu.Unlock()
	assert.True(t, upstreamSaw, "the upstream received the call's traceparent")

	var audited bool
	for _, ev := range h.auditEvents(t) {
		audited = audited || ev.TraceID == traceID
	}
	assert.True(t, audited, "the audit event carries the span's trace ID")
}

// toolCallSpans are the spans of tools/call requests (every request to /mcp has one).
func toolCallSpans(all []sdktrace.ReadOnlySpan) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range all {
		if s.Name() == "mcp tools/call" {
			out = append(out, s)
		}
	}
	return out
}
