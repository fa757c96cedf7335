package proxy

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
)

// connect sends a CONNECT from a sandbox address and returns the response.
func (h *harness) connect(t *testing.T, from, target string) (*http.Response, *bufio.Reader, net.Conn) {
	t.Helper()
	c, br := h.rawClient(t, from)
	_, err := io.WriteString(c, "CONNECT "+target+" HTTP/1.1\r\nHost: "+target+"\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	return resp, br, c
}

// innerRequest opens an intercepted tunnel to api.anthropic.com and sends raw bytes inside it.
func (h *harness) innerRequest(t *testing.T, from, raw string) *http.Response {
	t.Helper()
	c, br := h.rawClient(t, from)
	_, err := io.WriteString(c, "CONNECT api.anthropic.com:443 HTTP/1.1\r\nHost: api.anthropic.com:443\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode)
	tc := h.sandboxTLS(t, c, "api.anthropic.com")
	_, err = io.WriteString(tc, raw)
	require.NoError(t, err)
	resp, err = http.ReadResponse(bufio.NewReader(tc), nil)
	require.NoError(t, err)
	return resp
}

func bodyOf(t *testing.T, r *http.Response) string {
	b, _ := io.ReadAll(r.Body)
	return string(b)
}

func TestAttacksAreRefusedAndAudited(t *testing.T) {
	h := newHarness(t)
	const alpha = "127.0.0.2"
	msg := `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[]}`

	t.Run("inner request Host differs from CONNECT target is refused", func(t *testing.T) {
		resp := h.innerRequest(t, alpha, "POST /v1/messages HTTP/1.1\r\nHost: evil.example\r\nContent-Length: "+strconv.Itoa(len(msg))+"\r\n\r\n"+msg)
		assert.Equal(t, http.StatusMisdirectedRequest, resp.StatusCode)
		h.rec.waitFor(t, func(e audit.Event) bool { return e.Outcome.Error == "host_mismatch" && !e.Decision.Allow })
	})
	t.Run("inner request Host with a different port is refused", func(t *testing.T) {
		resp := h.innerRequest(t, alpha, "GET /v1/models HTTP/1.1\r\nHost: api.anthropic.com:8443\r\n\r\n")
		assert.Equal(t, http.StatusMisdirectedRequest, resp.StatusCode)
	})
	t.Run("absolute URI inside a tunnel is refused", func(t *testing.T) {
		resp := h.innerRequest(t, alpha, "GET https://evil.example/steal HTTP/1.1\r\nHost: api.anthropic.com\r\n\r\n")
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		h.rec.waitFor(t, func(e audit.Event) bool { return e.Outcome.Error == "absolute_uri_in_tunnel" })
	})

	for _, tc := range []struct {
		name, target string
		reason       DenyReason
	}{
		{"CONNECT to the metadata address is refused by the dial guard", "169.254.169.254:443", DenyMetadata},
		{"CONNECT to a private address is refused by the dial guard", "10.0.0.1:443", DenyPrivate},
		{"CONNECT to IPv6 loopback is refused by the dial guard", "[::1]:443", DenyLoopback},
		{"CONNECT to a name resolving to a private address is refused by the dial guard", "internal.test:443", DenyPrivate},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(h.dialed())
			resp, _, _ := h.connect(t, alpha, tc.target)
			assert.Equal(t, http.StatusForbidden, resp.StatusCode)
			assert.Contains(t, bodyOf(t, resp), string(tc.reason))
			assert.Len(t, h.dialed(), before, "nothing is dialed")
			ev := h.rec.waitFor(t, func(e audit.Event) bool {
				return e.Kind == audit.KindHTTPConnect && e.Outcome.Error == string(tc.reason) && e.Target.Host == strings.Trim(strings.TrimSuffix(tc.target, ":443"), "[]")
			})
			assert.False(t, ev.Decision.Allow)
			assert.Equal(t, "destination denied by dial guard: "+string(tc.reason), ev.Decision.Reason)
		})
	}

	t.Run("CONNECT to a host that is not configured is refused before any dial", func(t *testing.T) {
		before := len(h.dialed())
		resp, _, _ := h.connect(t, alpha, "example.org:443")
		assert.Equal(t, http.StatusForbidden, resp.StatusCode)
		assert.Len(t, h.dialed(), before)
	})

	t.Run("a resolver answering public then private is resolved once and the checked address dialed", func(t *testing.T) {
		resp, _, c := h.connect(t, alpha, "rebind.test:443")
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		require.NoError(t, c.Close())
		assert.Equal(t, int32(1), h.res.rebindCalls.Load(), "resolved exactly once")
		assert.Contains(t, h.dialed(), rebindPublic+":443", "the dial went to the checked address")
		ev := h.rec.waitFor(t, func(e audit.Event) bool { return e.Kind == audit.KindHTTPConnect && e.Target.Host == "rebind.test" })
		assert.True(t, ev.Decision.Allow)
	})

	t.Run("X-Forwarded-For cannot claim another sandbox's identity and is not forwarded", func(t *testing.T) {
		c, br := h.rawClient(t, "127.0.0.3") // beta may not use sonnet; alpha may
		req := "POST /routes/anthropic/v1/messages HTTP/1.1\r\nHost: sandgate\r\nX-Forwarded-For: 127.0.0.2\r\nX-Real-IP: 127.0.0.2\r\nForwarded: for=127.0.0.2\r\nContent-Length: " + strconv.Itoa(len(msg)) + "\r\n\r\n" + msg
		_, err := io.WriteString(c, req)
		require.NoError(t, err)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		assert.Equal(t, http.StatusForbidden, resp.StatusCode)
		_ = bodyOf(t, resp)
		ev := h.rec.waitFor(t, func(e audit.Event) bool {
			return e.Identity.Sandbox == "beta-1" && e.Target.Model == "claude-sonnet-4-5"
		})
		assert.False(t, ev.Decision.Allow)

		haiku := `{"model":"claude-haiku-4-5","max_tokens":10,"messages":[]}`
		req = "POST /routes/anthropic/v1/messages HTTP/1.1\r\nHost: sandgate\r\nX-Forwarded-For: 1.2.3.4\r\nX-Forwarded-Host: evil\r\nX-Real-IP: 1.2.3.4\r\nContent-Length: " + strconv.Itoa(len(haiku)) + "\r\n\r\n" + haiku
		_, err = io.WriteString(c, req)
		require.NoError(t, err)
		resp, err = http.ReadResponse(br, nil)
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, resp.StatusCode, bodyOf(t, resp))
		_, hdrs := h.up.seen()
		last := hdrs[len(hdrs)-1]
		for _, k := range []string{"X-Forwarded-For", "X-Forwarded-Host", "X-Real-Ip", "Forwarded", "Authorization"} {
			assert.Empty(t, last.Get(k), k)
		}
	})

	t.Run("request with both Content-Length and Transfer-Encoding is refused", func(t *testing.T) {
		c, br := h.rawClient(t, alpha)
		_, err := io.WriteString(c, "POST /routes/anthropic/v1/messages HTTP/1.1\r\nHost: sandgate\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /routes/anthropic/v1/models HTTP/1.1\r\nHost: sandgate\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assert.True(t, resp.Close, "the connection is closed")
		h.rec.waitFor(t, func(e audit.Event) bool {
			return e.Outcome.Error == "request_smuggling" && e.Identity.Sandbox == "alpha-1"
		})
	})

	t.Run("request smuggling inside an intercepted tunnel is refused", func(t *testing.T) {
		resp := h.innerRequest(t, alpha, "POST /v1/messages HTTP/1.1\r\nHost: api.anthropic.com\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n")
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	})

	t.Run("oversized request head is refused", func(t *testing.T) {
		c, br := h.rawClient(t, alpha)
		_, err := io.WriteString(c, "GET /routes/anthropic/v1/models HTTP/1.1\r\nHost: sandgate\r\nX-Big: "+strings.Repeat("a", 20000)+"\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		assert.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)
		h.rec.waitFor(t, func(e audit.Event) bool { return e.Outcome.Error == "header_too_large" })
	})

	t.Run("huge request head that net/http refuses itself is still audited", func(t *testing.T) {
		before := len(h.rec.all())
		c, br := h.rawClient(t, alpha)
		_, _ = io.WriteString(c, "GET /routes/anthropic/v1/models HTTP/1.1\r\nHost: sandgate\r\nX-Big: "+strings.Repeat("a", 60000)+"\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		assert.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)
		assert.Eventually(t, func() bool { return len(h.rec.all()) > before }, 5*time.Second, 20*time.Millisecond)
	})

	t.Run("body with a duplicated model key is refused", func(t *testing.T) {
		dup := `{"model":"claude-sonnet-4-5","model":"claude-opus-4-1","max_tokens":1}`
		c, br := h.rawClient(t, alpha)
		_, _ = io.WriteString(c, "POST /routes/anthropic/v1/messages HTTP/1.1\r\nHost: sandgate\r\nContent-Length: "+strconv.Itoa(len(dup))+"\r\n\r\n"+dup)
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	})

	t.Run("route path with dot segments is refused", func(t *testing.T) {
		c, br := h.rawClient(t, alpha)
		_, _ = io.WriteString(c, "GET /routes/anthropic/v1/%2e%2e/admin HTTP/1.1\r\nHost: sandgate\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		require.NoError(t, err)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	})
}

func TestSilentTunnels(t *testing.T) {
	h := newHarness(t)
	const alpha = "127.0.0.2"
	for _, tc := range []struct{ name, target string }{
		{"a tunnel whose client never speaks is closed after the handshake timeout", "tunnel.test:443"},
		{"an intercepted tunnel whose client never starts TLS is closed after the handshake timeout", "api.anthropic.com:443"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, br, _ := h.connect(t, alpha, tc.target)
			require.Equal(t, http.StatusOK, resp.StatusCode)
			start := time.Now()
			_, err := br.ReadByte()
			assert.Error(t, err, "the proxy closes the connection")
			assert.Less(t, time.Since(start), 3*time.Second)
			ev := h.rec.waitFor(t, func(e audit.Event) bool {
				return e.Kind == audit.KindHTTPConnect && e.Outcome.Error == "client_silent" && e.Target.Host == strings.TrimSuffix(tc.target, ":443")
			})
			assert.Greater(t, ev.Outcome.DurationMS, 400.0)
		})
	}
	t.Run("tunnels beyond the per-sandbox cap are refused", func(t *testing.T) {
		var open []net.Conn
		for range 4 {
			resp, _, c := h.connect(t, alpha, "tunnel.test:443")
			require.Equal(t, http.StatusOK, resp.StatusCode)
			open = append(open, c)
		}
		resp, _, _ := h.connect(t, alpha, "tunnel.test:443")
		assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
		h.rec.waitFor(t, func(e audit.Event) bool { return e.Outcome.Error == "too_many_tunnels" })
		for _, c := range open {
			_ = c.Close()
		}
	})
}

func TestAuditUnavailableFailsClosed(t *testing.T) {
	h := newHarness(t)
	h.rec.broken.Store(true)
	resp, _, _ := h.connect(t, "127.0.0.2", "api.anthropic.com:443")
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Contains(t, bodyOf(t, resp), "audit log unavailable")
	c, br := h.rawClient(t, "127.0.0.2")
	_, _ = io.WriteString(c, "GET /routes/anthropic/v1/models HTTP/1.1\r\nHost: sandgate\r\n\r\n")
	r2, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	assert.Equal(t, http.StatusServiceUnavailable, r2.StatusCode)
	keys, _ := h.up.seen()
	assert.Empty(t, keys)
}
