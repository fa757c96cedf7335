package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReadyzWaitsForEveryUpstreamToBeTried: serve's /readyz answers 503, naming the gateway's
// upstreams, while an upstream's first connection is still under way, and 200 once it was
// tried: an endpoint does not send sandboxes to a replica whose catalog is not there yet.
// Before, /readyz said ready at once and the first calls answered "tool not found".
func TestReadyzWaitsForEveryUpstreamToBeTried(t *testing.T) {
	s := server.NewMCPServer("github", "1", server.WithToolCapabilities(false))
	s.AddTool(mcp.NewTool("get_issue"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("issue 1"), nil
	})
	mcpSrv := server.NewStreamableHTTPServer(s, server.WithStateful(true))
	release := make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release // the upstream answers nothing before the test lets it
		mcpSrv.ServeHTTP(w, r)
	}))
	t.Cleanup(up.Close)
	t.Cleanup(releaseOnce) // before the upstream closes: its handlers return

	dir := t.TempDir()
	admin := freeAddr(t)
	cfg := writeFile(t, dir, "sandgate.yaml", fmt.Sprintf(`listen: {mcp: %q, proxy: %q, admin: %q}
policy: {dir: %q}
audit: {file: {dir: %q, fsync: never}}
shutdown: {delay: 0s}
gateway:
  upstreams:
    - {name: github, url: %q, prefix: never, connect_timeout: 60s}
log: {level: warn, format: text}
`, freeAddr(t), freeAddr(t), admin, repoPath(t, "policies"), filepath.Join(dir, "audit"), up.URL+"/mcp"))
	startServe(t, cfg, func(string) string { return "" })
	readyz := func() (int, string) {
		resp, err := http.Get("http://" + admin + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var code int
	var body string
	require.Eventually(t, func() bool { code, body = readyz(); return code != 0 }, 30*time.Second, 20*time.Millisecond, "serve answers")
	assert.Equal(t, http.StatusServiceUnavailable, code, body)
	assert.Contains(t, body, "gateway upstreams tried")

	releaseOnce()
	require.Eventually(t, func() bool { code, body = readyz(); return code == http.StatusOK }, 30*time.Second, 20*time.Millisecond,
		"ready once the upstream was tried: %s", body)
}
