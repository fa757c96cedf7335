package proxy

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/policy"
)

// allowAll decides every request allowed: these tests are about what happens after policy.
type allowAll struct{}

func (allowAll) Decide(context.Context, *policy.Input) policy.Decision {
	return policy.Decision{Allow: true, Reason: "allowed by the test", Code: "allow", Revision: "test"}
}
func (allowAll) Revision() string { return "test" }

func TestRefusalsTakeTheProvidersShape(t *testing.T) {
	h := newHarnessWith(t, func(o *Options) { o.Policy = allowAll{} }, func(p *config.Proxy) {
		p.Routes = append(p.Routes,
			config.ProxyRoute{Name: "openai", Upstream: "https://api.openai.com", API: config.APIOpenAI, AllowPrivate: true},
			config.ProxyRoute{Name: "nx", Upstream: "https://nxdomain.test", API: config.APINone, AllowPrivate: true})
	})
	post := func(route, body string) (int, map[string]any, http.Header) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+h.addr+"/routes/"+route+"/v1/x", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var v map[string]any
		require.NoError(t, json.Unmarshal(b, &v), "%s", b)
		return resp.StatusCode, v, resp.Header
	}

	t.Run("an Anthropic route answers in Anthropic's error shape", func(t *testing.T) {
		status, v, _ := post("anthropic", `{"model":5}`)
		assert.Equal(t, http.StatusBadRequest, status)
		assert.Equal(t, "error", v["type"])
		e := v["error"].(map[string]any)
		assert.Equal(t, "invalid_request_error", e["type"])
	})
	t.Run("an OpenAI route answers in OpenAI's error shape", func(t *testing.T) {
		status, v, _ := post("openai", `{"model":5}`)
		assert.Equal(t, http.StatusBadRequest, status)
		assert.NotContains(t, v, "type", "OpenAI's body has only error")
		e := v["error"].(map[string]any)
		assert.Equal(t, "invalid_request_error", e["type"])
		assert.Equal(t, "bad_model_request", e["code"])
		assert.Contains(t, e, "param")
	})
	t.Run("a name that does not resolve is the upstream's failure (502), not a denial", func(t *testing.T) {
		status, v, _ := post("nx", `{}`)
		assert.Equal(t, http.StatusBadGateway, status)
		e := v["error"].(map[string]any)
		assert.Equal(t, "api_error", e["type"])
		assert.Equal(t, "resolve_failed", e["code"])
		ev := h.rec.waitFor(t, func(e audit.Event) bool { return e.Target.Route == "nx" })
		assert.True(t, ev.Decision.Allow, "the decision stands: policy allowed it")
		assert.Equal(t, "resolve_failed", ev.Outcome.Error)
		assert.Equal(t, http.StatusBadGateway, ev.Outcome.Status)
	})
}

func TestLimitRefusalsSayWhenToRetry(t *testing.T) {
	w := httptest.NewRecorder()
	writeRefusal(w, &call.Refusal{Code: "rate_limited", Reason: "rate limit", RetryAfter: 1500 * time.Millisecond}, false)
	assert.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.Equal(t, "2", w.Header().Get("Retry-After"))
	assert.Contains(t, w.Body.String(), `"rate_limit_error"`)
}
