package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
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

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/policy"
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

// A sandbox listener is a readiness check of its own: /readyz fails, naming it, until its port is
// bound, and stays failing when the bind fails. The components start side by side, so the admin
// listener (and /readyz with it) is often up before the MCP one; a 200 then sent the first
// requests to a port that refused them (a CI flake in the tests, a lost request in a rollout).
func TestReadyzWaitsForTheSandboxListeners(t *testing.T) {
	core, err := call.New(call.Options{Audit: discardEvents{}, Policy: discardEvents{}})
	require.NoError(t, err)
	d := &serveDeps{ready: &readiness{}, log: slog.New(slog.DiscardHandler), core: core, cfg: &config.Config{}}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { taken.Close() })
	served := make(chan net.Listener, 1)
	serve := func(ctx context.Context, ln net.Listener) error {
		served <- ln
		<-ctx.Done()
		return ln.Close()
	}
	mcpC := listenerComponent("mcp", "127.0.0.1:0", d, serve)
	proxyC := listenerComponent("proxy", taken.Addr().String(), d, serve)
	listenerComponent("admin", "127.0.0.1:0", d, serve) // /readyz is its own: no check
	listenerComponent("routes", "", d, serve)           // disabled: no check
	assert.Equal(t, map[string]string{"mcp listener": "not listening yet", "proxy listener": "not listening yet"}, d.ready.Check())

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mcpC.Serve(ctx) }()
	ln := <-served // bound: serve has the listener
	assert.Equal(t, map[string]string{"proxy listener": "not listening yet"}, d.ready.Check())
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err, "ready means the port takes connections")
	c.Close()
	cancel()
	require.NoError(t, <-done)

	require.ErrorContains(t, proxyC.Serve(context.Background()), "listen.proxy: "+taken.Addr().String()+" is in use")
	assert.Equal(t, map[string]string{"proxy listener": "not listening yet"}, d.ready.Check(), "a bind that failed is never ready")
}

// discardEvents is the request path's audit and policy in a test that sends it no call.
type discardEvents struct{}

func (discardEvents) Record(*audit.Event) error { return nil }
func (discardEvents) Healthy() error            { return nil }
func (discardEvents) Revision() string          { return "r1" }
func (discardEvents) Decide(context.Context, *policy.Input) policy.Decision {
	return policy.Decision{Reason: "never asked"}
}
