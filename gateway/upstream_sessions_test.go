package gateway

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

// callSessions calls echo from each sandbox and returns the upstream session each call used.
func callSessions(t *testing.T, up *rawUpstream, sandboxes ...*rawSession) []string {
	t.Helper()
	var out []string
	for _, s := range sandboxes {
		before := len(up.received("tools/call"))
		s.call("tools/call", map[string]any{"name": "echo", "arguments": map[string]any{"message": "hi"}})
		calls := up.received("tools/call")
		require.Len(t, calls, before+1)
		out = append(out, calls[before].Session)
	}
	return out
}

// TestEachSandboxSessionHasItsOwnUpstreamSession: on a stateful upstream, every sandbox session
// gets its own upstream session (none is the catalog's), reused for its later requests and
// ended with it; sessions: shared puts everyone on one.
func TestEachSandboxSessionHasItsOwnUpstreamSession(t *testing.T) {
	t.Run("per-sandbox", func(t *testing.T) {
		up := startRawUpstream(t, "testdata/rich-catalog.json")
		h := startGateway(t, "testdata/policy", config.Upstream{Name: "rich", URL: up.URL(), Prefix: config.PrefixNever,
			Sessions: config.SessionsPerSandbox, MaxSessions: 8})
		h.waitReady(t)
		a, b := openRawSession(t, h.URL(), "127.0.0.2"), openRawSession(t, h.URL(), "127.0.0.3")
		first := callSessions(t, up, a, b)
		again := callSessions(t, up, a, b)
		catalog := up.received("tools/list")[0].Session
		assert.NotEqual(t, first[0], first[1], "two sandboxes never share an upstream session")
		assert.NotContains(t, first, catalog, "sandboxes do not use the catalog's session")
		assert.Equal(t, first, again, "a sandbox keeps its upstream session")

		req, err := http.NewRequest(http.MethodDelete, h.URL(), nil)
		require.NoError(t, err)
		req.Header.Set("Mcp-Session-Id", a.sid)
		resp, err := a.hc.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Eventually(t, func() bool { return len(up.ended()) == 1 }, 5*time.Second, 10*time.Millisecond,
			"ending the sandbox session ends its upstream session")
		assert.Equal(t, first[0], up.ended()[0])
	})
	t.Run("shared", func(t *testing.T) {
		up := startRawUpstream(t, "testdata/rich-catalog.json")
		h := startGateway(t, "testdata/policy", config.Upstream{Name: "rich", URL: up.URL(), Prefix: config.PrefixNever,
			Sessions: config.SessionsShared})
		h.waitReady(t)
		got := callSessions(t, up, openRawSession(t, h.URL(), "127.0.0.2"), openRawSession(t, h.URL(), "127.0.0.3"))
		catalog := up.received("tools/list")[0].Session
		assert.Equal(t, []string{catalog, catalog}, got)
	})
	t.Run("bounded", func(t *testing.T) {
		up := startRawUpstream(t, "testdata/rich-catalog.json")
		h := startGateway(t, "testdata/policy", config.Upstream{Name: "rich", URL: up.URL(), Prefix: config.PrefixNever,
			Sessions: config.SessionsPerSandbox, MaxSessions: 1})
		h.waitReady(t)
		a, b := openRawSession(t, h.URL(), "127.0.0.2"), openRawSession(t, h.URL(), "127.0.0.3")
		callSessions(t, up, a, b)
		require.Eventually(t, func() bool { return len(up.ended()) == 1 }, 5*time.Second, 10*time.Millisecond,
			"at the limit the least recently used idle session is closed")
	})
}
