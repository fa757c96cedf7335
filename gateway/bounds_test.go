package gateway

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/respguard"
	"github.com/sandgate/sandgate/internal/respguard/respguardtest"
)

// An HTTP upstream's answer reaches mcp-go decoded, or not at all; and never over its bounds.
func TestBoundedTransport(t *testing.T) {
	msg := `{"jsonrpc":"2.0","id":1,"result":{"content":[]}}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		switch {
		case q.Get("c") == "snappy":
			w.Header().Set("Content-Encoding", "snappy")
			_, _ = io.WriteString(w, msg)
		case q.Get("c") != "":
			enc, ce := respguardtest.Encode([]byte(msg), strings.Split(q.Get("c"), ",")...)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Encoding", ce)
			_, _ = w.Write(enc)
		case q.Get("big") == "json":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"x":"`+strings.Repeat("y", 4096)+`"}`)
		case q.Get("big") == "event":
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: small\n\ndata: "+strings.Repeat("y", 4096)+"\n\n")
		}
	}))
	t.Cleanup(srv.Close)
	// As production's transport (gateway.go), the transport decodes nothing itself.
	tr := newBoundedTransport(&http.Transport{DisableCompression: true}, config.Upstream{MaxMessageBytes: 2048, MaxResponseBytes: 1 << 20})
	get := func(query string) (string, error) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+"?"+query, nil)
		require.NoError(t, err)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		assert.Empty(t, resp.Header.Get("Content-Encoding"))
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	for _, c := range []string{"gzip", "deflate", "deflate-raw", "br", "zstd", "br,gzip", "zstd,zstd"} {
		got, err := get("c=" + c)
		require.NoError(t, err, c)
		assert.Equal(t, msg, got, c)
	}
	for _, c := range []string{"snappy", "gzip,br,gzip,br,gzip"} { // unknown; one deeper than MaxCodings
		_, err := get("c=" + c)
		assert.ErrorIs(t, err, respguard.ErrEncoding, c)
		assert.Equal(t, "upstream_encoding", boundCode(err), c)
	}
	_, err := get("big=json")
	assert.ErrorIs(t, err, respguard.ErrTooLarge)
	assert.Equal(t, "upstream_too_large", boundCode(err))
	_, err = get("big=event")
	assert.ErrorIs(t, err, respguard.ErrTooLarge)
}

// An HTTP upstream's response head is bounded too: one over a megabyte (net/http's default is
// ten, read whole for each response) fails its call as upstream_too_large, and the gateway and
// the upstream's other calls go on.
func TestUpstreamHeadOverItsBoundFailsTheCall(t *testing.T) {
	leaky := startLeakyHTTPUpstream(t)
	target, err := url.Parse(leaky)
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(target)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		require.NoError(t, err)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if bytes.Contains(body, []byte(`"name":"leak-forms"`)) {
			w.Header().Set("X-Padding", strings.Repeat("p", 2<<20))
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	up := leakyUpstreams(t)["http"]
	up.URL = front.URL + target.Path

	h := startGateway(t, "testdata/policy", up)
	h.waitReady(t)
	c := connectSandbox(t, h.URL(), "127.0.0.2", nil)
	res, err := callTool(t, c, "leak-forms", nil)
	require.NoError(t, err)
	assert.True(t, res.IsError, "the call with a 2 MiB head fails")
	res, err = callTool(t, c, "leak-result", nil)
	require.NoError(t, err)
	assert.False(t, res.IsError, "the next call is served: %s", resultText(res))

	h.assertToolCallFailed(t, "leak-forms", "upstream_too_large", http.StatusBadGateway)
}
