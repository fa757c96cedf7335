package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
)

// An upstream that ends a stream before its end is not a clean end for the sandbox, and the
// event says so.
func TestTruncatedUpstreamStream(t *testing.T) {
	h, _ := scrubHarness(t)
	for _, tunnel := range []bool{false, true} {
		for _, path := range []string{"/sse/cut", "/sse/cut-mid-event", "/sse/reset"} {
			name := map[bool]string{false: "route: ", true: "tunnel: "}[tunnel] + path
			t.Run(name, func(t *testing.T) {
				f := h.fetch(t, tunnel, path)
				assert.Equal(t, http.StatusOK, f.final.StatusCode, "the headers were sent before the cut")
				assert.ErrorIs(t, f.bodyErr, io.ErrUnexpectedEOF, "no chunked terminator: the sandbox sees the cut")
				assert.Contains(t, f.body, "message_start")
				route := map[bool]string{false: "anthropic", true: ""}[tunnel]
				ev := h.rec.waitFor(t, func(e audit.Event) bool { return e.Target.Path == path && e.Target.Route == route })
				assert.Equal(t, "upstream_truncated", ev.Outcome.Error)
				assert.Equal(t, http.StatusBadGateway, ev.Outcome.Status)
				assert.True(t, ev.Decision.Allow)
			})
		}
	}
	t.Run("a complete stream is a success", func(t *testing.T) {
		f := h.fetch(t, false, "/echo/sse")
		require.NoError(t, f.bodyErr)
		ev := h.rec.waitFor(t, func(e audit.Event) bool { return e.Target.Path == "/echo/sse" })
		assert.Empty(t, ev.Outcome.Error)
		assert.Equal(t, 200, ev.Outcome.Status)
	})
}

// rawTLSUpstream is an HTTP/1.1 upstream for api.anthropic.com (route and intercepted host)
// that answers every request with the bytes of respond(path) and closes the connection: the
// framings the stand-in's net/http server never produces.
func rawTLSUpstream(t *testing.T, respond func(path string) string) *harness {
	var addr atomic.Value
	h := newHarnessWith(t, func(o *Options) {
		o.Dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr.Load().(string))
		}
	})
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{NextProtos: []string{"http/1.1"},
		GetCertificate: func(hi *tls.ClientHelloInfo) (*tls.Certificate, error) { return h.up.ca.Leaf(hi.ServerName) }})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	addr.Store(ln.Addr().String())
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r, err := http.ReadRequest(bufio.NewReader(c))
				if err == nil {
					_, _ = io.WriteString(c, respond(r.URL.Path))
				}
			}()
		}
	}()
	return h
}

// What an upstream cut looks like on the wire of HTTP/1.1: a close-delimited body closed
// early reads as a clean end (io.EOF), a chunked body without its terminator or a body shorter
// than its Content-Length as io.ErrUnexpectedEOF. Either way the sandbox must see a cut and the
// event must say upstream_truncated.
func TestTruncatedUpstreamFramings(t *testing.T) {
	const sse = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
	start := "event: message_start\ndata: {\"type\":\"message_start\"}\n\n"
	stop := "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
	// A model's usage can come in a large event (OpenAI's response.completed carries the whole
	// response): read up to the stream end's bound of 1 MiB, by the one parse both share.
	large := "event: message_delta\ndata: {\"type\":\"message_delta\",\"pad\":\"" + strings.Repeat("x", 300<<10) +
		"\",\"usage\":{\"input_tokens\":7,\"output_tokens\":300}}\n\n"
	responses := map[string]string{
		"/close-delimited/complete":  sse + "Connection: close\r\n\r\n" + start + stop,
		"/close-delimited/large":     sse + "Connection: close\r\n\r\n" + start + large + stop,
		"/close-delimited/large-cut": sse + "Connection: close\r\n\r\n" + start + large,
		"/close-delimited/cut":       sse + "Connection: close\r\n\r\n" + start,
		"/chunked/no-terminator":     sse + "Transfer-Encoding: chunked\r\n\r\n" + "2c\r\n" + start + "\r\n",
		"/json/short":                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":",
	}
	h := rawTLSUpstream(t, func(path string) string { return responses[path] })
	for _, tunnel := range []bool{false, true} {
		for _, path := range []string{"/close-delimited/complete", "/close-delimited/large", "/close-delimited/cut",
			"/close-delimited/large-cut", "/chunked/no-terminator", "/json/short"} {
			t.Run(map[bool]string{false: "route: ", true: "tunnel: "}[tunnel]+path, func(t *testing.T) {
				f := h.fetch(t, tunnel, path)
				route := map[bool]string{false: "anthropic", true: ""}[tunnel]
				ev := h.rec.waitFor(t, func(e audit.Event) bool { return e.Target.Path == path && e.Target.Route == route })
				if strings.HasSuffix(path, "/complete") || strings.HasSuffix(path, "/large") {
					require.NotNil(t, f.final)
					assert.NoError(t, f.bodyErr)
					assert.Empty(t, ev.Outcome.Error)
					assert.Equal(t, http.StatusOK, ev.Outcome.Status)
					if path == "/close-delimited/large" && !tunnel {
						assert.Equal(t, int64(300), ev.Outcome.TokensOut, "the large event's usage is read")
					}
					return
				}
				// A cut before anything was flushed closes the connection without a response.
				if f.final != nil {
					assert.Equal(t, http.StatusOK, f.final.StatusCode)
					assert.ErrorIs(t, f.bodyErr, io.ErrUnexpectedEOF, "the sandbox sees the cut")
				}
				assert.Equal(t, "upstream_truncated", ev.Outcome.Error)
				assert.Equal(t, http.StatusBadGateway, ev.Outcome.Status)
			})
		}
	}
}
