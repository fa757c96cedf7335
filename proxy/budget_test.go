package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/admission"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/limits"
)

// TestTokenBudgetAndSpans runs model requests of sdk-1 (127.0.0.1) against a budget of 20 tokens
// a day, with spans recorded.
func TestTokenBudgetAndSpans(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	adm, err := admission.New(limits.NewMemory(config.Limits{Default: config.LimitSet{TokensPerDay: 20}}), nil, nil, nil)
	require.NoError(t, err)
	h := newHarnessWith(t, func(o *Options) {
		o.Tracer = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
		o.Admission = adm
	})
	post := func(stream bool) (int, string) {
		body := `{"model":"claude-haiku-4-5","max_tokens":100,"stream":` + map[bool]string{true: "true", false: "false"}[stream] + `,"messages":[]}`
		resp, err := h.client(t, "127.0.0.1").Post("http://"+h.addr+"/routes/anthropic/v1/messages", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	t.Run("a stream that spends the budget ends after the event that spent it", func(t *testing.T) {
		status, body := post(true)
		require.Equal(t, 200, status, body)
		assert.Contains(t, body, "message_start")
		assert.True(t, strings.HasSuffix(body, "\n\n"), "the last event is complete: %q", body)
		assert.NotContains(t, body, "content_block_start")
		ev := h.rec.waitFor(t, func(e audit.Event) bool { return e.Outcome.TokensIn == 25 })
		assert.Equal(t, "token_budget_spent", ev.Outcome.Error)
		assert.True(t, ev.Decision.Allow)
	})

	t.Run("the request's span carries identity and decision and its traceparent reaches the upstream", func(t *testing.T) {
		ended := spans.Ended()
		require.NotEmpty(t, ended)
		s := ended[len(ended)-1]
		attrs := map[attribute.Key]attribute.Value{}
		for _, kv := range s.Attributes() {
			attrs[kv.Key] = kv.Value
		}
		assert.Equal(t, "sdk-1", attrs["sandgate.identity.sandbox"].AsString())
		assert.Equal(t, "agents", attrs["sandgate.identity.namespace"].AsString())
		assert.Equal(t, "beta", attrs["sandgate.identity.template"].AsString())
		assert.True(t, attrs["sandgate.decision.allow"].AsBool())
		assert.Equal(t, "api.anthropic.com", attrs["sandgate.upstream"].AsString())
		_, headers := h.up.seen()
		require.NotEmpty(t, headers)
		tp := headers[len(headers)-1].Get("Traceparent")
		assert.Contains(t, tp, s.SpanContext().TraceID().String())
		ev := h.rec.waitFor(t, func(e audit.Event) bool { return e.Outcome.TokensIn == 25 })
		assert.Equal(t, s.SpanContext().TraceID().String(), ev.TraceID)
	})

	t.Run("the next request is refused with the budget's reason", func(t *testing.T) {
		status, body := post(false)
		assert.Equal(t, http.StatusTooManyRequests, status)
		assert.Contains(t, body, "token budget of 20/day for sandbox agents/sdk-1")
		assert.Contains(t, body, `"code":"token_budget_spent"`)
		s := spans.Ended()[len(spans.Ended())-1]
		for _, kv := range s.Attributes() {
			if kv.Key == "sandgate.decision.code" {
				assert.Equal(t, "token_budget_spent", kv.Value.AsString())
			}
		}
	})
}
