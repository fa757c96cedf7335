package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/respguard"
)

// standInPaths are the stand-in's careless endpoints: each sends the injected key back on one
// channel, as debug endpoints and error pages do.
var standInPaths = withPaths(map[string]http.HandlerFunc{
	"/echo/header": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Debug-Auth", "seen "+r.Header.Get("X-Api-Key"))
		_, _ = io.WriteString(w, "ok")
	},
	"/echo/trailer": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "X-Debug-Key")
		_, _ = io.WriteString(w, "ok")
		w.(http.Flusher).Flush()
		w.Header().Set("X-Debug-Key", r.Header.Get("X-Api-Key"))
	},
	"/echo/early-hints": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</style.css>; rel=preload")
		w.Header().Set("X-Hint-Key", r.Header.Get("X-Api-Key"))
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("X-Hint-Key")
		_, _ = io.WriteString(w, "ok")
	},
	"/echo/body": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"error":"bad key","headers":{"x-api-key":"`+r.Header.Get("X-Api-Key")+`"}}`)
	},
	"/echo/split": func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-Api-Key")
		at, _ := strconv.Atoi(r.URL.Query().Get("at"))
		w.Header().Set("Content-Length", strconv.Itoa(len(key)+4))
		_, _ = io.WriteString(w, "<<"+key[:at])
		w.(http.Flusher).Flush()
		time.Sleep(3 * time.Millisecond)
		_, _ = io.WriteString(w, key[at:]+">>")
	},
	"/echo/base64": func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-Api-Key")
		_, _ = io.WriteString(w, base64.StdEncoding.EncodeToString([]byte(key))+"\n"+
			base64.URLEncoding.EncodeToString([]byte("x-api-key: "+key+"\r\n"))+"\n")
	},
	"/echo/sse": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "event: content_block_delta\ndata: {\"text\":\"key "+r.Header.Get("X-Api-Key")+"\"}\n\n")
		w.(http.Flusher).Flush()
		time.Sleep(400 * time.Millisecond)
		_, _ = io.WriteString(w, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	},
	"/sse/cut": func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\"}\n\n")
	},
	"/sse/cut-mid-event": func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\"}\n\nevent: message_stop\n")
	},
	"/sse/reset": func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\"}\n\n")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	},
}, codingPaths)

const alpha = "127.0.0.2"

// scrubHarness is the harness with a metric reader and room for many tunnels.
func scrubHarness(t *testing.T) (*harness, *sdkmetric.ManualReader) {
	reader := sdkmetric.NewManualReader()
	h := newHarnessWith(t, func(o *Options) { o.Meters = sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)) },
		func(p *config.Proxy) { p.Limits.TunnelsPerSandbox = 100 })
	return h, reader
}

// fetched is what a sandbox got for one request: every byte, and the responses read from them.
type fetched struct {
	raw     []byte
	interim []*http.Response
	final   *http.Response
	body    string
	bodyErr error
}

// fetch sends GET path (with Connection: close) from sandbox alpha through the base-URL route,
// or inside an intercepted tunnel to api.anthropic.com, and reads until the proxy closes. final
// is nil when the proxy closed the connection without a response.
func (h *harness) fetch(t *testing.T, tunnel bool, path string) fetched {
	t.Helper()
	c, br := h.rawClient(t, alpha)
	conn, target, host := c, "/routes/anthropic"+path, h.addr
	if tunnel {
		_, err := io.WriteString(c, "CONNECT api.anthropic.com:443 HTTP/1.1\r\nHost: api.anthropic.com:443\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		conn, target, host = h.sandboxTLS(t, c, "api.anthropic.com"), path, "api.anthropic.com"
	}
	_, err := io.WriteString(conn, "GET "+target+" HTTP/1.1\r\nHost: "+host+"\r\nX-Api-Key: sk-placeholder\r\nConnection: close\r\n\r\n")
	require.NoError(t, err)
	var f fetched
	f.raw, _ = io.ReadAll(conn) // an aborted response ends in an error; the bytes are what counts
	if len(f.raw) == 0 {
		return f // closed before the head was sent: final is nil
	}
	rd := bufio.NewReader(bytes.NewReader(f.raw))
	for {
		resp, err := http.ReadResponse(rd, nil)
		require.NoError(t, err, "%q", f.raw)
		if resp.StatusCode < 200 {
			f.interim = append(f.interim, resp)
			continue
		}
		f.final = resp
		b, err := io.ReadAll(resp.Body)
		f.body, f.bodyErr = string(b), err
		return f
	}
}

// echoes sums sandgate.proxy.credential_echoes for a route ("" inside tunnels).
func echoes(t *testing.T, reader *sdkmetric.ManualReader, route string) int64 {
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "sandgate.proxy.credential_echoes" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				r, _ := dp.Attributes.Value("route")
				h, _ := dp.Attributes.Value("host")
				if r.AsString() == route && h.AsString() == "api.anthropic.com" {
					n += dp.Value
				}
			}
		}
	}
	return n
}

// keyForms are the credential as a sandbox must never see it: raw and base64 at every
// alignment.
func keyForms() []string { return respguard.Forms(realKey) }

func assertNoKey(t *testing.T, raw []byte) {
	t.Helper()
	for _, f := range keyForms() {
		assert.NotContains(t, string(raw), f)
	}
}

// Security invariant 1: whatever channel an upstream echoes the injected key on, the sandbox
// gets no byte of it, and the event and the metric say it happened.
func TestEchoedCredentialNeverReachesTheSandbox(t *testing.T) {
	h, reader := scrubHarness(t)
	marker := func(n int) string { return (respguard.Marker + strings.Repeat("*", n))[:n] }
	channels := []struct {
		name  string
		path  string
		check func(t *testing.T, f fetched)
	}{
		{"a response header is removed", "/echo/header", func(t *testing.T, f fetched) {
			assert.Empty(t, f.final.Header.Get("X-Debug-Auth"))
			assert.Equal(t, "ok", f.body)
		}},
		{"a trailer is removed", "/echo/trailer", func(t *testing.T, f fetched) {
			assert.Equal(t, "ok", f.body)
			assert.Empty(t, f.final.Trailer.Get("X-Debug-Key"))
		}},
		{"a 103 Early Hints header is removed, the hint is passed on", "/echo/early-hints", func(t *testing.T, f fetched) {
			require.Len(t, f.interim, 1)
			assert.Equal(t, http.StatusEarlyHints, f.interim[0].StatusCode)
			assert.Equal(t, "</style.css>; rel=preload", f.interim[0].Header.Get("Link"))
			assert.Empty(t, f.interim[0].Header.Get("X-Hint-Key"))
		}},
		{"a body echo is overwritten with a marker of the same length", "/echo/body", func(t *testing.T, f fetched) {
			assert.Equal(t, `{"error":"bad key","headers":{"x-api-key":"`+marker(len(realKey))+`"}}`, f.body)
			assert.Equal(t, strconv.Itoa(len(f.body)), f.final.Header.Get("Content-Length"))
		}},
		{"a base64 echo is overwritten", "/echo/base64", func(t *testing.T, f fetched) {
			assert.Contains(t, f.body, respguard.Marker[:8])
		}},
		{"an SSE echo is overwritten and the stream ends cleanly", "/echo/sse", func(t *testing.T, f fetched) {
			require.NoError(t, f.bodyErr)
			assert.Contains(t, f.body, `{"text":"key `+marker(len(realKey))+`"}`)
			assert.True(t, strings.HasSuffix(f.body, "data: {\"type\":\"message_stop\"}\n\n"))
		}},
	}
	for _, tunnel := range []bool{false, true} {
		route := map[bool]string{false: "anthropic", true: ""}[tunnel]
		for _, ch := range channels {
			t.Run(map[bool]string{false: "route: ", true: "tunnel: "}[tunnel]+ch.name, func(t *testing.T) {
				before := echoes(t, reader, route)
				f := h.fetch(t, tunnel, ch.path)
				assertNoKey(t, f.raw)
				require.Equal(t, http.StatusOK, f.final.StatusCode)
				ch.check(t, f)
				ev := h.rec.waitFor(t, func(e audit.Event) bool { return e.Target.Path == ch.path && e.Target.Route == route })
				assert.True(t, ev.Outcome.CredentialEchoed, "the event says the credential was echoed")
				assert.Equal(t, 200, ev.Outcome.Status)
				assert.Equal(t, before+1, echoes(t, reader, route))
			})
		}
		t.Run(map[bool]string{false: "route: ", true: "tunnel: "}[tunnel]+"a body echo split across two reads, at every split point", func(t *testing.T) {
			before := echoes(t, reader, route)
			for at := 1; at < len(realKey); at++ {
				f := h.fetch(t, tunnel, "/echo/split?at="+strconv.Itoa(at))
				assertNoKey(t, f.raw)
				assert.Equal(t, "<<"+marker(len(realKey))+">>", f.body, "split at %d", at)
			}
			assert.Equal(t, before+int64(len(realKey)-1), echoes(t, reader, route))
		})
	}
}

// The scrubber holds back only what could begin a credential: an SSE event reaches the sandbox
// when the upstream sends it, not with the next one.
func TestScrubbedSSEFlowsEventByEvent(t *testing.T) {
	h, _ := scrubHarness(t)
	c, br := h.rawClient(t, alpha)
	_, err := io.WriteString(c, "GET /routes/anthropic/echo/sse HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	require.NoError(t, err)
	start := time.Now()
	resp, err := http.ReadResponse(br, nil)
	require.NoError(t, err)
	event, err := bufio.NewReader(resp.Body).ReadString('}')
	require.NoError(t, err)
	assert.Less(t, time.Since(start), 300*time.Millisecond, "the first event came without waiting for the second")
	assert.Contains(t, event, respguard.Marker)
}
