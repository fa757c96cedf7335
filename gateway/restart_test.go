package gateway

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/config"
)

func TestUpstreamKilledAndRestartedRecoversWithoutRestartingSandgate(t *testing.T) {
	up := startHTTPUpstream(t, "127.0.0.1:0")
	addr := up.srv.Listener.Addr().String()
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "http", URL: up.URL()})
	h.waitReady(t)
	c := connectSandbox(t, h.URL(), "127.0.0.2", nil)
	res, err := callTool(t, c, "echo", map[string]any{"message": "before"})
	require.NoError(t, err)
	require.Equal(t, "before", resultText(res))

	up.srv.Close() // killed: connections refused from now on

	res, err = callTool(t, c, "echo", map[string]any{"message": "meanwhile"})
	if err == nil {
		assert.True(t, res.IsError, "a call while the upstream is down is an error result")
		assert.Contains(t, resultText(res), "upstream http")
	}
	require.Eventually(t, func() bool { return h.gw.Ready() != nil }, 10*time.Second, 20*time.Millisecond)
	assert.Contains(t, h.gw.Ready().Error(), "upstream http down")
	assert.ElementsMatch(t, []string{"echo", "add"}, toolNames(t, c), "a down upstream's tools stay listed")
	res, err = callTool(t, c, "echo", map[string]any{"message": "down"})
	require.NoError(t, err)
	assert.True(t, res.IsError)
	assert.Contains(t, resultText(res), "upstream_unavailable", "not 'not found': the tool exists, its upstream is down")
	require.Eventually(t, func() bool {
		for _, ev := range h.auditEvents(t) {
			if ev.Kind == audit.KindToolsCall && ev.Outcome.Error == "upstream_unavailable" {
				return ev.Outcome.Status == http.StatusServiceUnavailable && ev.Decision.Allow
			}
		}
		return false
	}, 10*time.Second, 20*time.Millisecond, "the call is audited as upstream_unavailable (503), not as hidden")

	// Restarted on the same address, as a new process would be: its sessions are new.
	startHTTPUpstream(t, addr)
	h.waitReady(t)
	assert.ElementsMatch(t, []string{"echo", "add"}, toolNames(t, c))
	res, err = callTool(t, c, "echo", map[string]any{"message": "after"})
	require.NoError(t, err)
	assert.Equal(t, "after", resultText(res))
}

func TestExpiredUpstreamSessionIsReestablishedTransparently(t *testing.T) {
	up := startHTTPUpstream(t, "127.0.0.1:0")
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "http", URL: up.URL()})
	h.waitReady(t)
	c := connectSandbox(t, h.URL(), "127.0.0.2", nil)
	// Ending the upstream session behind Sandgate's back: the next call gets a 404 from the
	// upstream and must still succeed.
	cli, _, err := h.gw.upstreams[0].client()
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodDelete, up.URL(), nil)
	require.NoError(t, err)
	req.Header.Set("Mcp-Session-Id", cli.GetSessionId())
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	res, err := callTool(t, c, "echo", map[string]any{"message": "again"})
	require.NoError(t, err)
	assert.Equal(t, "again", resultText(res))
}
