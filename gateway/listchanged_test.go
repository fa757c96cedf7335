package gateway

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

// TestToolAddedUpstreamAppears: a tool an upstream adds while connected reaches the sandboxes'
// lists, on the legacy revision (notification on the session's stream) and on 2026-07-28
// (notification on the subscriptions/listen stream).
func TestToolAddedUpstreamAppears(t *testing.T) {
	for _, version := range []string{"", mcp.LATEST_LEGACY_PROTOCOL_VERSION} {
		t.Run("negotiated "+version, func(t *testing.T) {
			s := server.NewMCPServer("growing", "1", server.WithToolCapabilities(true))
			handler := func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return mcp.NewToolResultText("ok"), nil
			}
			s.AddTool(mcp.NewTool("echo"), handler)
			srv := httptest.NewServer(server.NewStreamableHTTPServer(s, server.WithStateful(true)))
			t.Cleanup(srv.Close)
			h := startGateway(t, "testdata/policy", config.Upstream{Name: "http", URL: srv.URL + "/mcp", ProtocolVersion: version})
			h.waitReady(t)
			c := connectSandbox(t, h.URL(), "127.0.0.2", nil)
			require.Equal(t, []string{"echo"}, toolNames(t, c))

			s.AddTool(mcp.NewTool("added"), handler)
			require.Eventually(t, func() bool { return slices.Contains(toolNames(t, c), "added") }, 5*time.Second, 20*time.Millisecond)
		})
	}
}

// TestToolAddedBeforeTheListenStreamOpensAppears: on 2026-07-28 list changes reach Sandgate
// only on its subscriptions/listen stream, which opens after the catalog was listed. A tool
// the upstream adds in between is told to no stream: the catalog is listed again once the
// stream is acknowledged. The upstream here holds the listen request until the tool is added.
func TestToolAddedBeforeTheListenStreamOpensAppears(t *testing.T) {
	s := server.NewMCPServer("growing", "1", server.WithToolCapabilities(true))
	handler := func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("ok"), nil
	}
	s.AddTool(mcp.NewTool("echo"), handler)
	mcpHandler := server.NewStreamableHTTPServer(s, server.WithStateful(true))
	listening, added := make(chan struct{}), make(chan struct{})
	var once sync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		if bytes.Contains(body, []byte(`"method":"subscriptions/listen"`)) {
			once.Do(func() { close(listening) })
			select {
			case <-added:
			case <-r.Context().Done():
				return
			}
		}
		mcpHandler.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "http", URL: srv.URL + "/mcp"})
	h.waitReady(t)
	c := connectSandbox(t, h.URL(), "127.0.0.2", nil)
	require.Equal(t, []string{"echo"}, toolNames(t, c))

	select {
	case <-listening:
	case <-time.After(10 * time.Second):
		t.Fatal("Sandgate never opened its subscriptions/listen stream")
	}
	s.AddTool(mcp.NewTool("added"), handler) // no stream listens yet: no one is told
	close(added)
	require.Eventually(t, func() bool { return slices.Contains(toolNames(t, c), "added") }, 10*time.Second, 20*time.Millisecond,
		"the tool added before the stream opened is listed")
}
