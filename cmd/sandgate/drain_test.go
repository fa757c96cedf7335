package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
)

// On SIGTERM (serve's context ends) the MCP calls in flight finish and are audited as
// answered; the upstream still running a tool is not cut off.
func TestShutdownDrainsCallsInFlight(t *testing.T) {
	entered, release := make(chan struct{}, 10), make(chan struct{})
	s := server.NewMCPServer("github", "1", server.WithToolCapabilities(false))
	s.AddTool(mcp.NewTool("get_issue"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		entered <- struct{}{}
		<-release
		return mcp.NewToolResultText("issue 1"), nil
	})
	up := httptest.NewServer(server.NewStreamableHTTPServer(s, server.WithStateful(true)))
	t.Cleanup(up.Close)

	dir := t.TempDir()
	r := &replica{name: "drain", mcp: freeAddr(t), proxy: freeAddr(t), admin: freeAddr(t), auditDir: filepath.Join(dir, "audit")}
	cfg := writeFile(t, dir, "sandgate.yaml", fmt.Sprintf(`listen: {mcp: %q, proxy: %q, admin: %q}
policy: {dir: %q}
audit: {file: {dir: %q, fsync: never}}
shutdown: {delay: 0s}
gateway:
  upstreams:
    - {name: github, url: %q, prefix: never}
identity:
  static:
    - {addresses: [%q], namespace: agents, sandbox: coder-1, template: coding-agent}
log: {level: warn, format: text}
`, r.mcp, r.proxy, r.admin, repoPath(t, "policies"), r.auditDir, up.URL+"/mcp", coderAddr))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, &cliEnv{stdout: io.Discard, stderr: io.Discard, getenv: func(string) string { return "" }}, []string{"serve", "--config", cfg})
	}()
	t.Cleanup(func() { cancel() })
	require.Eventually(t, func() bool { // ready, and the upstream connected (not degraded)
		resp, err := http.Get("http://" + r.admin + "/readyz")
		if err != nil {
			return false
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode == 200 && !strings.Contains(string(body), "gateway upstreams")
	}, 30*time.Second, 20*time.Millisecond)

	const calls = 5
	results := make(chan string, calls)
	for range calls {
		c := r.mcpSession(t, coderAddr)
		go func() {
			ok, text := callTool(t, c, "get_issue", nil)
			results <- fmt.Sprint(ok, " ", text)
		}()
	}
	for range calls {
		<-entered // every call is running in the upstream
	}
	cancel() // SIGTERM
	close(release)
	for range calls {
		assert.Equal(t, "true issue 1", <-results)
	}
	select {
	case code := <-done:
		assert.Equal(t, 0, code)
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop")
	}
	res, err := audit.Query(context.Background(), r.auditDir, audit.Filter{Kind: "mcp.tools_call", Limit: -1})
	require.NoError(t, err)
	require.Len(t, res.Events, calls, "one event per call")
	for _, ev := range res.Events {
		assert.Equal(t, 200, ev.Outcome.Status, "%+v", ev.Outcome)
	}
}
