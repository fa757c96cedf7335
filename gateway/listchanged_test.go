package gateway

import (
	"context"
	"net/http/httptest"
	"slices"
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
