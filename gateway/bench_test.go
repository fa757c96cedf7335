package gateway

import (
	"testing"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

// BenchmarkToolsCall compares one tools/call through Sandgate (policy decision, audit event to
// the file writer, forward over a pooled connection) with the same call made directly.
func BenchmarkToolsCall(b *testing.B) {
	up := startHTTPUpstream(b, "127.0.0.1:0")
	h := startGateway(b, "testdata/policy", config.Upstream{Name: "http", URL: up.URL()})
	h.waitReady(b)
	direct := func() *client.Client {
		tr, err := transport.NewStreamableHTTP(up.URL(), transport.WithHTTPBasicClient(sandboxHTTPClient("127.0.0.2", nil)))
		require.NoError(b, err)
		c := client.NewClient(tr, client.WithProtocolVersion(mcp.LATEST_LEGACY_PROTOCOL_VERSION))
		require.NoError(b, c.Start(b.Context()))
		init := mcp.InitializeRequest{}
		init.Params.ProtocolVersion = mcp.LATEST_LEGACY_PROTOCOL_VERSION
		_, err = c.Initialize(b.Context(), init)
		require.NoError(b, err)
		b.Cleanup(func() { c.Close() })
		return c
	}()
	through := connectSandbox(b, h.URL(), "127.0.0.2", nil)
	for _, bc := range []struct {
		name string
		c    *client.Client
	}{{"direct", direct}, {"through-sandgate", through}} {
		b.Run(bc.name, func(b *testing.B) {
			req := mcp.CallToolRequest{}
			req.Params.Name = "echo"
			req.Params.Arguments = map[string]any{"message": "hello"}
			for b.Loop() {
				res, err := bc.c.CallTool(b.Context(), req)
				if err != nil || res.IsError {
					b.Fatalf("call: %v %v", err, res)
				}
			}
		})
	}
}
