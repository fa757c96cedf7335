package gateway

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/sse"
)

// startChattyUpstream serves an mcp-go upstream whose tool "chatty" sends n log messages and n
// progress notifications, interleaved, before its result; with arguments who and delay_ms,
// the messages name who and are delay_ms apart.
func startChattyUpstream(t testing.TB, n int) string {
	t.Helper()
	s := server.NewMCPServer("chatty", "1", server.WithToolCapabilities(true), server.WithLogging())
	s.AddTool(mcp.NewTool("chatty"), func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var token mcp.ProgressToken
		if req.Params.Meta != nil {
			token = req.Params.Meta.ProgressToken
		}
		who := req.GetString("who", "")
		delay := time.Duration(req.GetInt("delay_ms", 0)) * time.Millisecond
		for i := range n {
			time.Sleep(delay)
			_ = s.SendLogMessageToClient(ctx, mcp.NewLoggingMessageNotification(mcp.LoggingLevelInfo, "chatty", fmt.Sprint("log ", i, who)))
			if token != nil {
				_ = s.SendNotificationToClient(ctx, "notifications/progress",
					map[string]any{"progressToken": token, "progress": i + 1, "total": n})
			}
		}
		return mcp.NewToolResultText("done" + req.GetString("then", "")), nil
	})
	srv := httptest.NewServer(server.NewStreamableHTTPServer(s, server.WithStateful(true),
		server.WithEventStore(server.NewInMemoryEventStore()), // mcp-go orders notifications before the result only with one
		server.WithDisableStreaming(true)))                    // see noGETStream
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp"
}

// noGETStream is why the mcp-go upstreams of tests about a call's notifications offer no GET
// stream (405): mcp-go v1.2.1's server feeds a session's GET stream and each of its calls'
// streams from one channel, so with a GET stream open (Sandgate opens one on every upstream
// session) a call's notifications land on either, as they would for a client connected
// directly, and Sandgate passes each on where it arrived (docs/mcp-gateway.md).

// TestNotificationsKeepTheSandboxTokenAndPrecedeTheResult: what an upstream sends about a
// call before its result reaches the sandbox before that result, in order, and progress comes
// back under the sandbox's own token value (number or string, as sent).
func TestNotificationsKeepTheSandboxTokenAndPrecedeTheResult(t *testing.T) {
	const n = 5
	// Pinned to the legacy revision: mcp-go streams 2026-07-28 responses without an event store,
	// and then itself loses a notification now and then, before Sandgate sees it.
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "http", URL: startChattyUpstream(t, n), ProtocolVersion: mcp.LATEST_LEGACY_PROTOCOL_VERSION})
	h.waitReady(t)
	s := openRawSession(t, h.URL(), "127.0.0.2")
	s.call("logging/setLevel", map[string]any{"level": "debug"})

	for _, token := range []any{float64(8), "8", "sandbox-token"} {
		t.Run(fmt.Sprint(token), func(t *testing.T) {
			for range 10 { // the race this guards against does not show every time
				_, notes := s.callStream("tools/call", map[string]any{"name": "chatty", "arguments": map[string]any{},
					"_meta": map[string]any{"progressToken": token}})
				var logs []string
				var progress []any
				for _, m := range notes {
					switch m.Method {
					case "notifications/message":
						logs = append(logs, fmt.Sprint(m.Params["data"]))
					case "notifications/progress":
						require.Equal(t, token, m.Params["progressToken"], "the sandbox sees its own token")
						progress = append(progress, m.Params["progress"])
					}
				}
				require.Len(t, logs, n, "every log message arrives before the result")
				require.Len(t, progress, n, "every progress notification arrives before the result")
				for i := range n {
					assert.Equal(t, fmt.Sprint("log ", i), logs[i])
					assert.Equal(t, float64(i+1), progress[i])
				}
			}
		})
	}
}

// TestSandboxResumesAStreamWithLastEventID: every event of a call's stream has an ID, and a
// sandbox that lost the stream after the first event gets the rest again, result included, by
// resuming with Last-Event-ID on the same replica.
func TestSandboxResumesAStreamWithLastEventID(t *testing.T) {
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "http", URL: startChattyUpstream(t, 3),
		ProtocolVersion: mcp.LATEST_LEGACY_PROTOCOL_VERSION})
	h.waitReady(t)
	s := openRawSession(t, h.URL(), "127.0.0.2")
	s.call("logging/setLevel", map[string]any{"level": "debug"}) // so that the call streams
	s.id++
	resp := s.post(map[string]any{"jsonrpc": "2.0", "id": s.id, "method": "tools/call",
		"params": map[string]any{"name": "chatty", "arguments": map[string]any{}}})
	first := sseEvents(t, resp)[0]
	require.NotEmpty(t, first.id, "events carry IDs")

	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, h.URL(), nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", s.sid)
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	req.Header.Set("Last-Event-ID", first.id)
	resp, err = s.hc.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	replayed := sseEvents(t, resp)
	require.NotEmpty(t, replayed)
	assert.Contains(t, replayed[len(replayed)-1].data, `"result"`, "the replay ends with the result")
	assert.NotContains(t, replayed[0].data, `"log 0"`, "nothing before Last-Event-ID is sent again")
}

type streamEvent struct{ id, data string }

// sseEvents reads an SSE response (internal/sse) until it ends or carries a JSON-RPC response.
func sseEvents(t *testing.T, resp *http.Response) []streamEvent {
	t.Helper()
	defer resp.Body.Close()
	var out []streamEvent
	rd := sse.NewReader(resp.Body, 1<<20)
	for {
		ev, err := rd.Next()
		if err != nil {
			return out
		}
		out = append(out, streamEvent{id: ev.ID, data: string(ev.Data)})
		if strings.Contains(string(ev.Data), `"result"`) {
			return out
		}
	}
}

// TestConcurrentCallsEachGetTheirOwnLogMessages: log messages name no request, so on a shared
// upstream session they could be attributed only while one call was in flight. With an upstream
// session per sandbox session, concurrent calls of two sandboxes each get all of their own log
// messages and none of the other's.
func TestConcurrentCallsEachGetTheirOwnLogMessages(t *testing.T) {
	const n = 5
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "http", URL: startChattyUpstream(t, n),
		ProtocolVersion: mcp.LATEST_LEGACY_PROTOCOL_VERSION})
	h.waitReady(t)
	var wg sync.WaitGroup
	for _, src := range []string{"127.0.0.1", "127.0.0.2"} {
		s := openRawSession(t, h.URL(), src)
		s.call("logging/setLevel", map[string]any{"level": "debug"})
		wg.Go(func() {
			_, notes := s.callStream("tools/call", map[string]any{"name": "chatty",
				"arguments": map[string]any{"who": " of " + src, "delay_ms": 20}})
			var logs []string
			for _, m := range notes {
				if m.Method == "notifications/message" {
					logs = append(logs, fmt.Sprint(m.Params["data"]))
				}
			}
			want := make([]string, n)
			for i := range want {
				want[i] = fmt.Sprint("log ", i, " of ", src)
			}
			assert.Equal(t, want, logs, "sandbox %s", src)
		})
	}
	wg.Wait()
}

// lastEventData is the data of the last event of body, an SSE stream (internal/sse).
func lastEventData(body []byte) []byte {
	var last []byte
	rd := sse.NewReader(bytes.NewReader(body), len(body)+1)
	rd.Lenient = true
	for {
		ev, err := rd.Next()
		if err != nil {
			return last
		}
		last = ev.Data
	}
}
