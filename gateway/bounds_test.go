package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
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
	tr := newBoundedTransport(http.DefaultTransport, config.Upstream{MaxMessageBytes: 2048, MaxResponseBytes: 1 << 20})
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
	_, err := get("c=snappy")
	assert.ErrorIs(t, err, respguard.ErrEncoding)
	assert.Equal(t, "upstream_encoding", boundCode(err))
	_, err = get("big=json")
	assert.ErrorIs(t, err, respguard.ErrTooLarge)
	assert.Equal(t, "upstream_too_large", boundCode(err))
	_, err = get("big=event")
	assert.ErrorIs(t, err, respguard.ErrTooLarge)
}
