package proxy

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/respguard"
	"github.com/sandgate/sandgate/internal/respguard/respguardtest"
)

// An upstream that answers in content codings of its own choosing, parts of representations,
// or a decompression bomb: the stand-in's paths for them (added to standInPaths).
var codingPaths = map[string]http.HandlerFunc{
	// /coded?c=br,gzip echoes the key in a JSON body with those codings applied in order.
	"/coded": func(w http.ResponseWriter, r *http.Request) {
		body := []byte(`{"error":"bad key","headers":{"x-api-key":"` + r.Header.Get("X-Api-Key") + `"}}`)
		enc, ce := respguardtest.Encode(body, strings.Split(r.URL.Query().Get("c"), ",")...)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", ce)
		_, _ = w.Write(enc)
	},
	// /coded-unknown echoes the key raw, labelled with a coding no one decodes.
	"/coded-unknown": func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "snappy")
		_, _ = io.WriteString(w, "key="+r.Header.Get("X-Api-Key"))
	},
	// /coded-deep echoes the key in a stack of one coding more than Sandgate decodes.
	"/coded-deep": func(w http.ResponseWriter, r *http.Request) {
		body := []byte(`{"headers":{"x-api-key":"` + r.Header.Get("X-Api-Key") + `"}}`)
		enc, ce := respguardtest.Encode(body, "gzip", "br", "gzip", "br", "gzip")
		w.Header().Set("Content-Encoding", ce)
		_, _ = w.Write(enc)
	},
	// /range echoes the key and honours Range, as a static file server does.
	"/range": func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "echo.txt", time.Time{}, strings.NewReader("key="+r.Header.Get("X-Api-Key")))
	},
	// /partial answers with 3 bytes of the key as a 206 whatever was asked.
	"/partial": func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-Api-Key")
		w.Header().Set("Content-Range", "bytes 0-2/"+strconv.Itoa(len(key)))
		w.WriteHeader(http.StatusPartialContent)
		_, _ = io.WriteString(w, key[:3])
	},
	// /bomb is 64 MiB of zeros, gzipped twice.
	"/bomb": func(w http.ResponseWriter, _ *http.Request) {
		enc, ce := bomb()
		w.Header().Set("Content-Encoding", ce)
		_, _ = w.Write(enc)
	},
}

// bomb is /bomb's body and coding, compressed once: compressing 64 MiB inside each request
// took most of a fetch's deadline under the race detector on a busy machine.
var bomb = sync.OnceValues(func() ([]byte, string) {
	return respguardtest.Encode(make([]byte, 64<<20), "gzip", "gzip")
})

// withPaths is paths with more added.
func withPaths(paths, more map[string]http.HandlerFunc) map[string]http.HandlerFunc {
	for p, f := range more {
		paths[p] = f
	}
	return paths
}

// sandboxBody is the body as a sandbox's HTTP client hands it over: decoded when it still
// carries a content coding.
func sandboxBody(t *testing.T, f fetched) []byte {
	t.Helper()
	resp := &http.Response{Header: f.final.Header, Body: io.NopCloser(strings.NewReader(f.body))}
	if err := respguard.Decode(resp); err != nil {
		return []byte(f.body)
	}
	b, _ := io.ReadAll(resp.Body)
	return b
}

// Security invariant 1 in every content coding: a body in a coding Sandgate decodes reaches
// the sandbox decoded and scrubbed; any other coding is refused.
func TestCodedEchoNeverReachesTheSandbox(t *testing.T) {
	h, _ := scrubHarness(t)
	bomb() // compressed before any fetch's deadline starts
	stacks := []string{"gzip", "x-gzip", "deflate", "deflate-raw", "br", "zstd", "gzip,br", "br,zstd,deflate", "identity,zstd"}
	for _, tunnel := range []bool{false, true} {
		route := map[bool]string{false: "anthropic", true: ""}[tunnel]
		want := 0
		for _, stack := range stacks {
			t.Run(map[bool]string{false: "route: ", true: "tunnel: "}[tunnel]+stack, func(t *testing.T) {
				path := "/coded?c=" + stack
				f := h.fetch(t, tunnel, path)
				require.NotNil(t, f.final)
				require.Equal(t, http.StatusOK, f.final.StatusCode)
				body := sandboxBody(t, f)
				assertNoKey(t, body)
				assert.Empty(t, f.final.Header.Get("Content-Encoding"), "passed on without the coding")
				assert.Contains(t, string(body), `"x-api-key":"`+respguard.Marker[:8])
				want++
				require.Eventually(t, func() bool {
					n := 0
					for _, e := range h.rec.all() {
						if e.Target.Path == "/coded" && e.Target.Route == route && e.Outcome.CredentialEchoed && e.Outcome.Status == 200 {
							n++
						}
					}
					return n >= want
				}, 5*time.Second, 10*time.Millisecond, "each coded echo's event says credential_echoed")
			})
		}
		for _, path := range []string{"/coded-unknown", "/coded-deep"} {
			t.Run(map[bool]string{false: "route: ", true: "tunnel: "}[tunnel]+path+" is refused", func(t *testing.T) {
				f := h.fetch(t, tunnel, path)
				require.NotNil(t, f.final)
				assert.Equal(t, http.StatusBadGateway, f.final.StatusCode)
				assertNoKey(t, f.raw)
				ev := h.rec.waitFor(t, func(e audit.Event) bool { return e.Target.Path == path && e.Target.Route == route })
				assert.Equal(t, "upstream_encoding", ev.Outcome.Error)
				assert.Equal(t, http.StatusBadGateway, ev.Outcome.Status)
			})
		}
		t.Run(map[bool]string{false: "route: ", true: "tunnel: "}[tunnel]+"a decompression bomb is cut, not buffered", func(t *testing.T) {
			f := h.fetch(t, tunnel, "/bomb")
			require.NotNil(t, f.final)
			assert.Error(t, f.bodyErr, "the sandbox sees the cut")
			assert.Less(t, len(f.body), 64<<20)
			ev := h.rec.waitFor(t, func(e audit.Event) bool { return e.Target.Path == "/bomb" && e.Target.Route == route })
			assert.Equal(t, "upstream_too_large", ev.Outcome.Error)
		})
	}
}

// A sandbox cannot assemble the key from partial responses: Range never reaches an upstream
// on a credentialed request, and a partial response to one is refused.
func TestNoPiecesOfACredentialedResponse(t *testing.T) {
	h, _ := scrubHarness(t)
	get := func(t *testing.T, tunnel bool, path, rng string) fetched {
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
		_, err := io.WriteString(conn, "GET "+target+" HTTP/1.1\r\nHost: "+host+"\r\nRange: "+rng+"\r\nIf-Range: x\r\nConnection: close\r\n\r\n")
		require.NoError(t, err)
		raw, _ := io.ReadAll(conn)
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		return fetched{raw: raw, final: resp, body: string(b)}
	}
	for _, tunnel := range []bool{false, true} {
		name := map[bool]string{false: "route: ", true: "tunnel: "}[tunnel]
		t.Run(name+"ranges of an echo, byte by byte", func(t *testing.T) {
			var assembled strings.Builder
			for i := 4; i < 4+len(realKey); i++ {
				f := get(t, tunnel, "/range", "bytes="+strconv.Itoa(i)+"-"+strconv.Itoa(i))
				assert.Equal(t, http.StatusOK, f.final.StatusCode, "the upstream never saw the Range")
				assembled.WriteString(strings.TrimPrefix(f.body, "key="))
			}
			assert.NotContains(t, assembled.String(), realKey[:12])
			_, headers := h.up.seen()
			for _, hd := range headers[len(headers)-len(realKey):] {
				assert.Empty(t, hd.Get("Range"))
				assert.Empty(t, hd.Get("If-Range"))
			}
		})
		t.Run(name+"a partial response is refused", func(t *testing.T) {
			f := get(t, tunnel, "/partial", "bytes=0-2")
			assert.Equal(t, http.StatusBadGateway, f.final.StatusCode)
			assert.NotContains(t, f.body, realKey[:3])
			route := map[bool]string{false: "anthropic", true: ""}[tunnel]
			ev := h.rec.waitFor(t, func(e audit.Event) bool { return e.Target.Path == "/partial" && e.Target.Route == route })
			assert.Equal(t, "upstream_partial", ev.Outcome.Error)
		})
	}
}
