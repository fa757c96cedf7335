package gateway

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/catalogs"
	"github.com/sandgate/sandgate/internal/config"
)

// closedURL is an MCP URL on a loopback port nothing listens on: an upstream that is down.
func closedURL(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return "http://" + addr + "/mcp"
}

func toolCallEvents(evs []audit.Event) []audit.Event {
	var out []audit.Event
	for _, ev := range evs {
		if ev.Kind == audit.KindToolsCall {
			out = append(out, ev)
		}
	}
	return out
}

// TestUpstreamDownAtStartKeepsItsLastKnownTools: a gateway restarted while an upstream is down
// lists the tools that upstream had (saved beside the audit log by the run before), and their
// calls answer upstream_unavailable (503 in the event). Before, the tools vanished until the
// upstream came back and their calls answered "tool not found".
func TestUpstreamDownAtStartKeepsItsLastKnownTools(t *testing.T) {
	store := catalogs.NewFile(filepath.Join(t.TempDir(), catalogs.FileName))
	withStore := func(o *Options) { o.Catalogs = store }
	up := startHTTPUpstream(t, "127.0.0.1:0")
	ucfg := config.Upstream{Name: "http", URL: up.URL(), ConnectTimeout: config.Duration(time.Second)}
	first := startGatewayWith(t, "testdata/policy", withStore, ucfg)
	first.waitReady(t)
	up.srv.Close() // down from now on

	h := startGatewayWith(t, "testdata/policy", withStore, ucfg)
	require.Eventually(t, func() bool { return h.gw.Tried() == nil }, 30*time.Second, 10*time.Millisecond)
	require.Error(t, h.gw.Ready(), "the upstream is down")
	c := connectSandbox(t, h.URL(), "127.0.0.2", nil)
	assert.ElementsMatch(t, []string{"echo", "add"}, toolNames(t, c), "the last known tools are listed")
	res, err := callTool(t, c, "echo", map[string]any{"message": "hi"})
	require.NoError(t, err)
	assert.True(t, res.IsError)
	assert.Contains(t, resultText(res), call.CodeUpstreamUnavailable)

	evs := toolCallEvents(h.auditEvents(t))
	require.Len(t, evs, 1)
	assert.Equal(t, call.CodeUpstreamUnavailable, evs[0].Outcome.Error)
	assert.Equal(t, http.StatusServiceUnavailable, evs[0].Outcome.Status)
	assert.Equal(t, "http", evs[0].Target.Upstream)
	assert.Equal(t, "echo", evs[0].Target.Tool)
}

// TestUpstreamNeverSeenAnswersUnavailableUnderItsPrefix: an upstream that is down and of which
// no catalog was ever saved answers upstream_unavailable for any tool under its prefix; a name
// under no unseen upstream's prefix is still not found.
func TestUpstreamNeverSeenAnswersUnavailableUnderItsPrefix(t *testing.T) {
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "http", URL: closedURL(t), Prefix: config.PrefixAlways,
		ConnectTimeout: config.Duration(time.Second)})
	require.Eventually(t, func() bool { return h.gw.Tried() == nil }, 30*time.Second, 10*time.Millisecond)
	c := connectSandbox(t, h.URL(), "127.0.0.2", nil)
	assert.Empty(t, toolNames(t, c))
	res, err := callTool(t, c, "http_create_issue", map[string]any{"title": "x"})
	require.NoError(t, err)
	assert.True(t, res.IsError)
	assert.Contains(t, resultText(res), call.CodeUpstreamUnavailable)
	_, err = callTool(t, c, "other_tool", nil)
	require.Error(t, err, "a name under no upstream's prefix")
	assert.Contains(t, err.Error(), "not found")

	evs := toolCallEvents(h.auditEvents(t))
	require.Len(t, evs, 2)
	assert.Equal(t, call.CodeUpstreamUnavailable, evs[0].Outcome.Error)
	assert.Equal(t, http.StatusServiceUnavailable, evs[0].Outcome.Status)
	assert.Equal(t, "http", evs[0].Target.Upstream)
	assert.Equal(t, "create_issue", evs[0].Target.Tool)
	assert.True(t, evs[0].Decision.Allow, "policy decided it as a call to that upstream")
	assert.Equal(t, call.CodeNotFound, evs[1].Outcome.Error)
}

// TestCallDuringAnUpstreamsFirstConnectionWaitsForIt: an upstream slow to connect at start
// keeps the gateway not ready (Tried), and a call of its tool made meanwhile is answered with
// the tool's result once it connected, not "tool not found".
func TestCallDuringAnUpstreamsFirstConnectionWaitsForIt(t *testing.T) {
	release := make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	mcpSrv := server.NewStreamableHTTPServer(newUpstreamServer(), server.WithStateful(true))
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release // the upstream does not answer before the test lets it
		mcpSrv.ServeHTTP(w, r)
	}))
	t.Cleanup(slow.Close)
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "http", URL: slow.URL + "/mcp", ConnectTimeout: config.Duration(30 * time.Second)})
	t.Cleanup(releaseOnce) // first of the cleanups: the gateway and the upstream stop after it
	require.Error(t, h.gw.Tried(), "not ready while the first connection is under way")
	c := connectSandbox(t, h.URL(), "127.0.0.2", nil)
	before := h.gw.core.InFlight()
	type result struct {
		text string
		err  error
	}
	done := make(chan result, 1)
	go func() {
		req := callToolRequest("echo", map[string]any{"message": "hi"})
		res, err := c.CallTool(context.Background(), req)
		if err != nil {
			done <- result{err: err}
			return
		}
		done <- result{text: resultText(res)}
	}()
	require.Eventually(t, func() bool { return h.gw.core.InFlight() > before }, 30*time.Second, 5*time.Millisecond,
		"the call reached the gateway")
	releaseOnce()
	r := <-done
	require.NoError(t, r.err)
	assert.Equal(t, "hi", r.text)
	require.NoError(t, h.gw.Tried())
	assert.False(t, strings.Contains(r.text, "not found"))
}

func callToolRequest(name string, args map[string]any) mcp.CallToolRequest {
	req := mcp.CallToolRequest{}
	req.Params.Name = name
	req.Params.Arguments = args
	return req
}
