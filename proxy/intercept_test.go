package proxy

import (
	"bufio"
	"io"
	"math"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/config"
)

// An open intercepted tunnel costs the proxy one goroutine (its connection's), not also the
// goroutine that accepted the CONNECT; a closed one is audited once and gives back its slot
// of the sandbox's tunnel cap and its goroutine.
func TestInterceptedTunnelLifecycle(t *testing.T) {
	const alpha, n = "127.0.0.2", 40
	h := newHarness(t, func(p *config.Proxy) {
		p.Limits.TunnelsPerSandbox = n
		// The harness's 2 s idle timeout closed the first tunnels while the last opened on a
		// busy machine (a make test under load: the slot was free, 3 tunnels audited). Idle
		// tunnels are TestTunnelIdleTimeout's; here they stay open until the test closes them.
		p.Limits.TunnelIdleTimeout = config.Duration(time.Hour)
	})
	msg := `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[]}`
	req := "POST /v1/messages HTTP/1.1\r\nHost: api.anthropic.com\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(msg)) + "\r\n\r\n" + msg

	// open opens an intercepted tunnel and completes one request in it, keeping it alive. The
	// client side is driven by hand, so every goroutine it adds is the proxy's (or the stand-in's).
	open := func() net.Conn {
		c, br := h.rawClient(t, alpha)
		_, err := io.WriteString(c, "CONNECT api.anthropic.com:443 HTTP/1.1\r\nHost: api.anthropic.com:443\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		tc := h.sandboxTLS(t, c, "api.anthropic.com")
		_, err = io.WriteString(tc, req)
		require.NoError(t, err)
		resp, err = http.ReadResponse(bufio.NewReader(tc), nil)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		return tc
	}
	// connects counts the audit events of opened tunnels (not of refused CONNECTs).
	connects := func() int {
		k := 0
		for _, e := range h.rec.all() {
			if e.Kind == audit.KindHTTPConnect && e.Target.Host == "api.anthropic.com" && e.Outcome.Error != "too_many_tunnels" {
				k++
			}
		}
		return k
	}

	_ = open().Close() // the upstream pool's connection is made once, before counting
	require.Eventually(t, func() bool { return connects() == 1 }, 5*time.Second, 10*time.Millisecond)
	base := settledGoroutines()

	tunnels := make([]net.Conn, n)
	for i := range tunnels {
		tunnels[i] = open()
	}
	var perTunnel float64
	assert.Eventually(t, func() bool {
		perTunnel = float64(runtime.NumGoroutine()-base) / n
		return math.Abs(perTunnel-1) <= 0.2
	}, 30*time.Second, 20*time.Millisecond, "goroutines per open intercepted tunnel: want about 1")
	t.Logf("goroutines per open intercepted tunnel: %.2f", perTunnel)

	resp, _, _ := h.connect(t, alpha, "api.anthropic.com:443")
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "every open tunnel holds its slot")
	assert.Equal(t, 1, connects(), "an open tunnel is audited when it closes")

	for _, c := range tunnels {
		_ = c.Close()
	}
	require.Eventually(t, func() bool { return connects() == 1+n }, 5*time.Second, 10*time.Millisecond)
	for _, e := range h.rec.all() {
		if e.Kind == audit.KindHTTPConnect && e.Target.Host == "api.anthropic.com" && e.Outcome.Error != "too_many_tunnels" {
			assert.True(t, e.Decision.Allow)
			assert.Equal(t, http.StatusOK, e.Outcome.Status)
			assert.Empty(t, e.Outcome.Error)
			assert.Positive(t, e.Outcome.BytesIn)
			assert.Positive(t, e.Outcome.BytesOut)
		}
	}
	assert.Eventually(t, func() bool { return runtime.NumGoroutine()-base <= 2 }, 30*time.Second, 20*time.Millisecond,
		"closed tunnels leave no goroutine behind")
	_ = open().Close() // the slots are free again
}

// settledGoroutines is the goroutine count once it has stopped changing: the base the test
// counts from (the assertions poll towards it with a generous deadline).
func settledGoroutines() int {
	last := runtime.NumGoroutine()
	for range 100 {
		time.Sleep(20 * time.Millisecond)
		n := runtime.NumGoroutine()
		if n == last {
			return n
		}
		last = n
	}
	return last
}
