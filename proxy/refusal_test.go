package proxy

import (
	"context"
	"encoding/json"
	"io"
	"net"
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
			config.ProxyRoute{Name: "nx", Upstream: "https://nxdomain.test", API: config.APINone, AllowPrivate: true},
			config.ProxyRoute{Name: "closed", Upstream: "https://tunnel.test:" + closedPort(t), API: config.APINone, AllowPrivate: true})
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
		assert.Equal(t, "sandgate: upstream unreachable (resolve nxdomain.test: lookup nxdomain.test: no such host)", e["message"],
			"the message names the name that did not resolve and does not call it a denial")
		ev := h.rec.waitFor(t, func(e audit.Event) bool { return e.Target.Route == "nx" })
		assert.True(t, ev.Decision.Allow, "the decision stands: policy allowed it")
		assert.Equal(t, "resolve_failed", ev.Outcome.Error)
		assert.Equal(t, http.StatusBadGateway, ev.Outcome.Status)
	})
	t.Run("an upstream that refuses the connection is unreachable, not denied", func(t *testing.T) {
		status, v, hdr := post("closed", `{}`)
		assert.Equal(t, http.StatusServiceUnavailable, status, "as the gateway answers a call to an upstream that is down")
		e := v["error"].(map[string]any)
		assert.Equal(t, "upstream_unavailable", e["code"])
		assert.Regexp(t, `^sandgate: upstream unreachable \(dial tunnel\.test:[0-9]+: connect: connection refused\)$`, e["message"])
		assert.Regexp(t, `^sandgate; error=destination_unavailable; details="upstream_unavailable: upstream unreachable \(dial tunnel\.test:[0-9]+: connect: connection refused\)"$`, hdr.Get("Proxy-Status"))
	})
}

// closedPort is a loopback port nothing listens on.
func closedPort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	require.NoError(t, ln.Close())
	return port
}

// A refused CONNECT's body is hidden by most clients (curl -s prints nothing; curl -v and -i
// show the head): the head says why, in RFC 9209's Proxy-Status.
func TestRefusedConnectSaysWhyInItsHead(t *testing.T) {
	const alpha = "127.0.0.2"
	h := newHarnessWith(t, func(o *Options) { o.Policy = allowAll{} }, func(p *config.Proxy) {
		p.Hosts = append(p.Hosts, config.ProxyHost{Host: "nxdomain.test", Port: 443, Mode: config.ModeTunnel, API: config.APINone})
	})
	for _, tc := range []struct {
		name, target string
		status       int
		proxyStatus  string
		message      string
	}{
		{"a name that does not resolve", "nxdomain.test:443", http.StatusBadGateway,
			`sandgate; error=dns_error; details="resolve_failed: upstream unreachable (resolve nxdomain.test: lookup nxdomain.test: no such host)"`,
			"sandgate: upstream unreachable (resolve nxdomain.test: lookup nxdomain.test: no such host)"},
		{"a destination the dial guard refuses", "10.0.0.1:443", http.StatusForbidden,
			`sandgate; error=http_request_denied; details="private: destination denied by dial guard: private"`,
			"sandgate: destination denied by dial guard: private"},
		{"a host that is not configured", "example.org:443", http.StatusForbidden,
			`sandgate; error=http_request_denied; details="host_not_configured: example.org:443 is not a configured proxy host (proxy.hosts)"`,
			"sandgate: example.org:443 is not a configured proxy host (proxy.hosts)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, _, _ := h.connect(t, alpha, tc.target)
			assert.Equal(t, tc.status, resp.StatusCode)
			assert.Equal(t, tc.proxyStatus, resp.Header.Get("Proxy-Status"))
			var v map[string]any
			require.NoError(t, json.Unmarshal([]byte(bodyOf(t, resp)), &v))
			assert.Equal(t, tc.message, v["error"].(map[string]any)["message"], "the head and the body say the same")
		})
	}
}

func TestProxyStatusDetailsAreASafeString(t *testing.T) {
	rf := call.Refuse("model_not_allowed", "model \"cl\\aude\"\r\nX-Injected: 1 \u00e9 %s", strings.Repeat("x", 400))
	got := proxyStatus(rf)
	assert.True(t, strings.HasPrefix(got, `sandgate; error=http_request_denied; details="model_not_allowed: model \"cl\\aude\"??X-Injected: 1 ?? xxx`), got)
	assert.LessOrEqual(t, len(got), 320)
	assert.True(t, strings.HasSuffix(got, `"`))
	for _, c := range []byte(got) {
		assert.True(t, c >= 0x20 && c < 0x7f, "byte %#x in %q", c, got)
	}
}

func TestLimitRefusalsSayWhenToRetry(t *testing.T) {
	w := httptest.NewRecorder()
	writeRefusal(w, &call.Refusal{Code: "rate_limited", Reason: "rate limit", RetryAfter: 1500 * time.Millisecond}, false)
	assert.Equal(t, http.StatusTooManyRequests, w.Code)
	assert.Equal(t, "2", w.Header().Get("Retry-After"))
	assert.Contains(t, w.Body.String(), `"rate_limit_error"`)
}
