package gateway

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/mcpsessions"
	"github.com/sandgate/sandgate/test/redistest"
)

// TestSharedSessions runs two gateways sharing sessions through a real redis-server.
func TestSharedSessions(t *testing.T) {
	srv := redistest.Start(t)
	store := mcpsessions.NewRedis(srv.Client(t), "sg:", time.Second)
	up := startHTTPUpstream(t, "127.0.0.1:0")
	clock := &testClock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)} // advanced by the test: a refresh is due when it says a second passed
	shared := func(o *Options) { o.Sessions, o.now = store, clock.now }
	a := startGatewayWith(t, "testdata/policy", shared, config.Upstream{Name: "http", URL: up.URL()})
	b := startGatewayWith(t, "testdata/policy", shared, config.Upstream{Name: "http", URL: up.URL()})
	a.waitReady(t)
	b.waitReady(t)

	// post sends tools/list with session sid from src and returns the status.
	post := func(h *harness, src, sid string) int {
		req, _ := http.NewRequest(http.MethodPost, h.URL(), strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", sid)
		resp, err := sandboxHTTPClient(src, nil).Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}

	c := connectSandbox(t, a.URL(), "127.0.0.2", nil)
	sid := c.GetSessionId()
	require.NotEmpty(t, sid)

	tests := []struct {
		name   string
		h      *harness
		src    string
		before func()
		want   int
	}{
		{"a session created on one gateway is continued by the other", b, "127.0.0.2", nil, http.StatusOK},
		{"another source address cannot use it on either", b, "127.0.0.3", nil, http.StatusNotFound},
		{"a redis that lost its data does not end the session", a, "127.0.0.2", func() {
			srv.Stop()
			srv.Restart()
			clock.advance(mcpsessions.SharedRefresh) // the next request refreshes the record and shares it again
			require.Equal(t, http.StatusOK, post(a, "127.0.0.2", sid))
		}, http.StatusOK},
		{"after that the other gateway still continues it", b, "127.0.0.2", func() { clock.advance(mcpsessions.SharedRefresh) }, http.StatusOK},
		{"a session terminated on one gateway ends on the other within a second", b, "127.0.0.2", func() {
			require.NoError(t, c.Close()) // DELETE on a
			clock.advance(mcpsessions.SharedRefresh)
		}, http.StatusNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.before != nil {
				tt.before()
			}
			assert.Equal(t, tt.want, post(tt.h, tt.src, sid))
		})
	}
}

// TestStreamResumesOnAnotherReplica: with a shared store, a sandbox whose stream on one gateway
// broke resumes it on the other with Last-Event-ID and gets the rest, result included.
func TestStreamResumesOnAnotherReplica(t *testing.T) {
	srv := redistest.Start(t)
	store := mcpsessions.NewRedis(srv.Client(t), "sg:", time.Second)
	up := startChattyUpstream(t, 3)
	shared := func(o *Options) { o.Sessions = store }
	cfg := config.Upstream{Name: "http", URL: up, ProtocolVersion: mcp.LATEST_LEGACY_PROTOCOL_VERSION}
	a := startGatewayWith(t, "testdata/policy", shared, cfg)
	b := startGatewayWith(t, "testdata/policy", shared, cfg)
	a.waitReady(t)
	b.waitReady(t)

	s := openRawSession(t, a.URL(), "127.0.0.2")
	s.call("logging/setLevel", map[string]any{"level": "debug"}) // so that the call streams
	s.id++
	resp := s.post(map[string]any{"jsonrpc": "2.0", "id": s.id, "method": "tools/call",
		"params": map[string]any{"name": "chatty", "arguments": map[string]any{}}})
	first := sseEvents(t, resp)[0]

	var replayed []streamEvent
	require.Eventually(t, func() bool {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, b.URL(), nil)
		require.NoError(t, err)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("Mcp-Session-Id", s.sid)
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		req.Header.Set("Last-Event-ID", first.id)
		resp, err := s.hc.Do(req)
		require.NoError(t, err)
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return false
		}
		replayed = sseEvents(t, resp)
		return len(replayed) > 0 && strings.Contains(replayed[len(replayed)-1].data, `"result"`)
	}, 5*time.Second, 50*time.Millisecond, "the other gateway replays the stream")
	assert.NotContains(t, replayed[0].data, `"log 0"`, "nothing before Last-Event-ID is sent again")
}
