package proxy

import (
	"bufio"
	"errors"
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
	"github.com/sandgate/sandgate/internal/config"
)

// tunnel is the sandbox's end of an intercepted tunnel to api.anthropic.com, driven by hand.
type tunnel struct {
	c  net.Conn
	br *bufio.Reader
}

func (h *harness) openTunnel(t *testing.T, from string) *tunnel {
	t.Helper()
	resp, _, c := h.connect(t, from, "api.anthropic.com:443")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	tc := h.sandboxTLS(t, c, "api.anthropic.com")
	t.Cleanup(func() { _ = tc.Close() })
	return &tunnel{c: tc, br: bufio.NewReader(tc)}
}

func (tn *tunnel) send(t *testing.T, raw string) {
	t.Helper()
	_, err := io.WriteString(tn.c, raw)
	require.NoError(t, err)
}

// read reads one response to a request of method, whole.
func (tn *tunnel) read(t *testing.T, method string) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(tn.br, &http.Request{Method: method})
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

// closed reports whether the proxy closed the tunnel (the next read ends).
func (tn *tunnel) closed(t *testing.T) bool {
	t.Helper()
	_ = tn.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := tn.br.ReadByte()
	return err != nil
}

// eventsOf waits for the http.connect event of a tunnel closed after the first `from` events
// (a tunnel's event is recorded after every event of its requests) and returns the events
// recorded since, that one left out.
func (h *harness) eventsOf(t *testing.T, from int) []audit.Event {
	t.Helper()
	var got []audit.Event
	require.Eventually(t, func() bool {
		got = got[:0]
		done := false
		for _, e := range h.rec.all()[from:] {
			if e.Kind == audit.KindHTTPConnect {
				done = true
				continue
			}
			got = append(got, e)
		}
		return done
	}, 10*time.Second, 5*time.Millisecond)
	return got
}

const modelsReq = "GET /v1/models HTTP/1.1\r\nHost: api.anthropic.com\r\n\r\n"

func messagesReq(extra string) string {
	msg := `{"model":"claude-sonnet-4-5","max_tokens":10,"messages":[]}`
	return "POST /v1/messages HTTP/1.1\r\nHost: api.anthropic.com\r\nContent-Type: application/json\r\n" + extra +
		"Content-Length: " + strconv.Itoa(len(msg)) + "\r\n\r\n" + msg
}

// TestTunnelServesHTTP11 drives an intercepted tunnel's own request loop as a client would:
// requests one after another and pipelined, HEAD, 100-continue, HTTP/1.0, a request whose body
// the handler left unread; each answered once and audited once.
func TestTunnelServesHTTP11(t *testing.T) {
	h := newHarness(t)
	const alpha = "127.0.0.2"

	t.Run("requests one after another and pipelined share the tunnel", func(t *testing.T) {
		tn := h.openTunnel(t, alpha)
		for range 2 {
			tn.send(t, modelsReq)
			resp, body := tn.read(t, http.MethodGet)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, `{"data":[]}`, body)
		}
		before := len(h.rec.all())
		tn.send(t, messagesReq("")+modelsReq+messagesReq(""))
		for _, m := range []string{http.MethodPost, http.MethodGet, http.MethodPost} {
			resp, body := tn.read(t, m)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.NotEmpty(t, body)
		}
		_ = tn.c.Close()
		evs := h.eventsOf(t, before)
		require.Len(t, evs, 3)
		for _, e := range evs {
			assert.Equal(t, audit.KindHTTPRequest, e.Kind)
			assert.Equal(t, 200, e.Outcome.Status)
		}
	})
	t.Run("HEAD gets the head alone and the tunnel goes on", func(t *testing.T) {
		tn := h.openTunnel(t, alpha)
		tn.send(t, "HEAD /v1/models HTTP/1.1\r\nHost: api.anthropic.com\r\n\r\n")
		resp, body := tn.read(t, http.MethodHead)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Empty(t, body)
		tn.send(t, modelsReq)
		resp, body = tn.read(t, http.MethodGet)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, `{"data":[]}`, body)
	})
	t.Run("Expect: 100-continue is answered before the body is sent", func(t *testing.T) {
		tn := h.openTunnel(t, alpha)
		full := messagesReq("Expect: 100-continue\r\n")
		head, body, _ := strings.Cut(full, "\r\n\r\n")
		tn.send(t, head+"\r\n\r\n")
		resp, err := http.ReadResponse(tn.br, nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusContinue, resp.StatusCode)
		tn.send(t, body)
		resp, got := tn.read(t, http.MethodPost)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Contains(t, got, "Hello from stand-in")
	})
	t.Run("HTTP/1.0 without keep-alive is answered and closed", func(t *testing.T) {
		tn := h.openTunnel(t, alpha)
		tn.send(t, "GET /v1/models HTTP/1.0\r\nHost: api.anthropic.com\r\n\r\n")
		resp, body := tn.read(t, http.MethodGet)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, `{"data":[]}`, body)
		assert.True(t, tn.closed(t))
	})
	t.Run("a refused request's unread body is skipped and the tunnel goes on", func(t *testing.T) {
		tn := h.openTunnel(t, alpha)
		before := len(h.rec.all())
		h.rec.broken.Store(true)
		tn.send(t, messagesReq(""))
		resp, _ := tn.read(t, http.MethodPost)
		h.rec.broken.Store(false)
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		tn.send(t, messagesReq(""))
		resp, body := tn.read(t, http.MethodPost)
		assert.Equal(t, http.StatusOK, resp.StatusCode, body)
		_ = tn.c.Close()
		evs := h.eventsOf(t, before)
		require.Len(t, evs, 2)
		assert.Equal(t, "audit_unavailable", evs[0].Outcome.Error)
		assert.Equal(t, 200, evs[1].Outcome.Status)
	})
}

// TestTunnelRefusesBadHeadsOnce sends heads net/http's server would refuse by itself into an
// intercepted tunnel: each is answered with Sandgate's refusal and audited exactly once, and the
// tunnel closes.
func TestTunnelRefusesBadHeadsOnce(t *testing.T) {
	h := newHarness(t, func(p *config.Proxy) { p.Limits.ClientHandshakeTimeout = config.Duration(300 * time.Millisecond) })
	const alpha = "127.0.0.2"
	for _, tc := range []struct {
		name, raw string
		status    int // 0: no answer (the client left or was too slow)
		code      string
		leave     bool // the client closes its end after sending
	}{
		{"a header line without a colon", "GET /v1/models HTTP/1.1\r\nHost: api.anthropic.com\r\nno colon here\r\n\r\n", 400, "malformed_request", false},
		{"a bad request line", "GET\r\n\r\n", 400, "malformed_request", false},
		{"HTTP/2 in an HTTP/1.1 tunnel", "GET /v1/models HTTP/2.0\r\nHost: api.anthropic.com\r\n\r\n", 400, "malformed_request", false},
		{"no Host", "GET /v1/models HTTP/1.1\r\n\r\n", 400, "malformed_request", false},
		{"a Host with a space", "GET /v1/models HTTP/1.1\r\nHost: api anthropic\r\n\r\n", 400, "malformed_request", false},
		{"a header value with a control byte", "GET /v1/models HTTP/1.1\r\nHost: api.anthropic.com\r\nX-A: a\x01b\r\n\r\n", 400, "malformed_request", false},
		{"an Expect other than 100-continue", "GET /v1/models HTTP/1.1\r\nHost: api.anthropic.com\r\nExpect: teapot\r\n\r\n", 400, "malformed_request", false},
		{"a head over the limit", "GET /v1/models HTTP/1.1\r\nHost: api.anthropic.com\r\nX-Big: " + strings.Repeat("a", 20000) + "\r\n\r\n", 431, "header_too_large", false},
		{"a head past what is read", "GET /v1/models HTTP/1.1\r\nHost: api.anthropic.com\r\nX-Big: " + strings.Repeat("a", 80000) + "\r\n\r\n", 431, "header_too_large", false},
		{"a head cut short by the client", "GET /v1/models HTTP/1.1\r\nHost: api.anth", 0, "malformed_request", true},
		{"a head that stops arriving", "GET /v1/models HTTP/1.1\r\nHost: api.anth", 0, "header_timeout", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tn := h.openTunnel(t, alpha)
			before := len(h.rec.all())
			tn.send(t, tc.raw)
			if tc.leave {
				_ = tn.c.(interface{ CloseWrite() error }).CloseWrite()
			}
			if tc.status != 0 {
				resp, body := tn.read(t, http.MethodGet)
				assert.Equal(t, tc.status, resp.StatusCode)
				assert.Contains(t, body, tc.code)
			}
			assert.True(t, tn.closed(t), "the tunnel closes after a refused head")
			evs := h.eventsOf(t, before)
			require.Len(t, evs, 1, "one event: %+v", evs)
			assert.Equal(t, audit.KindHTTPRejected, evs[0].Kind)
			assert.Equal(t, tc.code, evs[0].Outcome.Error)
		})
	}
}

// TestServeShutsDownGracefully stops the proxy listener with one connection idle and one
// request in flight: the idle connection is closed, no new connection is accepted, the request
// in flight is answered, and only then does Serve return.
func TestServeShutsDownGracefully(t *testing.T) {
	h := newHarness(t)
	const alpha = "127.0.0.2"
	idle, ibr := h.rawClient(t, alpha)
	_, err := io.WriteString(idle, "GET /routes/anthropic/v1/models HTTP/1.1\r\nHost: sandgate\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(ibr, nil)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.Equal(t, http.StatusOK, resp.StatusCode)

	busy, bbr := h.rawClient(t, alpha)
	_, err = io.WriteString(busy, "GET /routes/anthropic/until-released HTTP/1.1\r\nHost: sandgate\r\n\r\n")
	require.NoError(t, err)
	<-waiter.entered

	stopped := make(chan error, 1)
	go func() { stopped <- h.stop() }()
	_ = idle.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = ibr.ReadByte()
	require.Error(t, err, "the idle connection is closed")
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "closed, not timed out: %v", err)
	_, err = net.DialTimeout("tcp", h.addr, time.Second)
	assert.Error(t, err, "the listener accepts no new connection")
	select {
	case err := <-stopped:
		t.Fatalf("Serve returned with a request in flight: %v", err)
	default:
	}

	waiter.release <- struct{}{}
	resp, err = http.ReadResponse(bbr, nil)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "released", string(body))
	require.NoError(t, <-stopped)
}
