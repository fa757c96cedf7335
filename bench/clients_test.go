package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/mark3labs/mcp-go/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A sandbox's MCP client ends its session when the cell closes it, as a real MCP client does,
// so the next cells do not measure the proxy carrying sessions nobody uses.
func TestMCPClientCloseEndsSession(t *testing.T) {
	srv := httptest.NewServer(server.NewStreamableHTTPServer(newMCPServer(), server.WithStateful(true)))
	defer srv.Close()
	ctx := context.Background()

	tr := &http.Transport{}
	c := &mcpClient{hc: &http.Client{Transport: tr}, tr: tr, url: srv.URL}
	require.NoError(t, c.Do(ctx, 1))
	sid := c.sid
	require.NotEmpty(t, sid, "initialize gave a session")

	c.Close()
	assert.Empty(t, c.sid)
	stale := &mcpClient{hc: &http.Client{Transport: tr}, tr: tr, url: srv.URL, sid: sid}
	err := stale.Do(ctx, 2)
	require.Error(t, err, "the server no longer knows the closed session")
	assert.Contains(t, err.Error(), "status 404")

	c.Close() // a client without a session closes without a request
}
