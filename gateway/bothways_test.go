package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/mcpsessions"
	"github.com/sandgate/sandgate/internal/sse"
)

// Traffic an upstream starts (issue 35), against the reference servers (reference_test.go): what
// it sends outside a call reaches the sandbox whose upstream session it is, or, where the
// upstream session is shared, the sandboxes it concerns; what it sends in a call reaches that
// call's stream, in the order it was sent.

const transientTool = "__transient_tool_for_list_changed"

// A tool an upstream adds while connected appears in the lists of the sandboxes that may see
// it, and those sandboxes, and only those, are told that their list changed.
func TestToolAddedUpstreamReachesTheSandboxes(t *testing.T) {
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "everything", URL: references(t).startGo(t), Prefix: config.PrefixNever})
	h.waitReady(t)
	full := connectListeningSandbox(t, h.URL(), "127.0.0.2", sandboxOptions{})
	narrow := connectListeningSandbox(t, h.URL(), "127.0.0.3", sandboxOptions{})
	require.NotContains(t, full.toolNames(t), transientTool)
	require.NotContains(t, narrow.toolNames(t), transientTool)

	res, err := callTool(t, narrow.Client, "test_trigger_tool_change", nil)
	require.NoError(t, err)
	require.False(t, res.IsError, resultText(res))

	full.await(t, string(mcp.MethodNotificationToolsListChanged))
	assert.Contains(t, full.toolNames(t), transientTool, "the new tool is listed")
	callRes, err := callTool(t, full.Client, transientTool, nil)
	require.NoError(t, err)
	assert.False(t, callRes.IsError, "the new tool answers: %s", resultText(callRes))

	// The sandboxes are told in the catalog's rebuild: once it is over, what a sandbox would be
	// sent is recorded (mcpsessions.Events), and the narrow one, which cannot see the tool, has nothing.
	h.gw.rebuildMu.Lock()
	//lint:ignore SA2001 locking waits for the rebuild in progress
	h.gw.rebuildMu.Unlock()
	assert.False(t, holds(h.gw.events, narrow.GetSessionId(), string(mcp.MethodNotificationToolsListChanged)),
		"a hidden tool's appearance is no news to a sandbox that cannot see it")
	assert.Empty(t, narrow.received(string(mcp.MethodNotificationToolsListChanged)))
	assert.NotContains(t, narrow.toolNames(t), transientTool)
}

// A sandbox subscribed to a resource gets its updates, which the upstream sends outside any
// call; a sandbox that did not subscribe gets none, with an upstream session per sandbox and
// with one shared by all.
func TestSubscribedSandboxGetsResourceUpdates(t *testing.T) {
	refs := references(t)
	for _, mode := range []string{config.SessionsPerSandbox, config.SessionsShared} {
		t.Run(mode, func(t *testing.T) {
			h := startGateway(t, "testdata/policy", config.Upstream{Name: "everything", URL: refs.startTS(t),
				Prefix: config.PrefixNever, Sessions: mode})
			h.waitReady(t)
			subscriber := connectListeningSandbox(t, h.URL(), "127.0.0.2", sandboxOptions{})
			other := connectListeningSandbox(t, h.URL(), "127.0.0.1", sandboxOptions{})
			list, err := subscriber.ListResources(t.Context(), mcp.ListResourcesRequest{})
			require.NoError(t, err)
			require.NotEmpty(t, list.Resources)
			uri := list.Resources[0].URI
			sub := mcp.SubscribeRequest{}
			sub.Params.URI = uri
			//lint:ignore SA1019 the reference server is of a revision with resources/subscribe
			require.NoError(t, subscriber.Subscribe(t.Context(), sub))

			// The server sends the updates of a session that turns them on, at once and then
			// every 5 seconds, outside any call.
			for _, s := range []*listeningSandbox{other, subscriber} {
				res, err := callTool(t, s.Client, "toggle-subscriber-updates", map[string]any{})
				require.NoError(t, err)
				require.False(t, res.IsError, resultText(res))
			}
			got := subscriber.await(t, mcp.MethodNotificationResourceUpdated)
			assert.Equal(t, uri, got[0].Params.AdditionalFields["uri"])
			assert.False(t, holds(h.gw.events, other.GetSessionId(), mcp.MethodNotificationResourceUpdated),
				"a sandbox that did not subscribe gets no update")
			assert.Empty(t, other.received(mcp.MethodNotificationResourceUpdated))
		})
	}
}

// An upstream that asks its client for the roots (roots/list, outside the call that needs them,
// on the session's GET stream) is answered with the sandbox's roots, at once; the request is one
// audit event.
func TestUpstreamRootsRequestIsAnsweredByTheSandbox(t *testing.T) {
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "everything", URL: references(t).startTS(t),
		Prefix: config.PrefixNever, CallTimeout: config.Duration(5 * time.Second)})
	h.waitReady(t)
	roots := fixedRoots{{URI: "file:///work/sandbox-repo", Name: "sandbox-repo"}}
	s := connectListeningSandbox(t, h.URL(), "127.0.0.2", sandboxOptions{roots: roots})

	start := time.Now()
	res, err := callTool(t, s.Client, "get-roots-list", map[string]any{})
	require.NoError(t, err)
	took := time.Since(start)
	require.False(t, res.IsError, resultText(res))
	assert.Contains(t, resultText(res), "file:///work/sandbox-repo", "the upstream got the sandbox's roots")
	t.Logf("get-roots-list answered in %s", took)

	var asked []audit.Event
	for _, ev := range h.auditEvents(t) {
		if ev.Kind == audit.KindServerRequest {
			asked = append(asked, ev)
		}
	}
	require.NotEmpty(t, asked, "the upstream's request is audited")
	for _, ev := range asked {
		assert.Equal(t, "roots/list", ev.Target.Method)
		assert.Equal(t, "everything", ev.Target.Upstream)
		assert.Equal(t, "full-2", ev.Identity.Sandbox)
		assert.Equal(t, http.StatusOK, ev.Outcome.Status)
	}
}

// A sandbox whose stream drops in the middle of a call and that resumes it with Last-Event-ID
// gets the rest of the call's progress and its result: a disconnection is not a cancellation.
func TestDroppedStreamIsNotACancellation(t *testing.T) {
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "everything", URL: references(t).startTS(t), Prefix: config.PrefixNever})
	h.waitReady(t)
	s := openRawSession(t, h.URL(), "127.0.0.2")
	s.id++
	resp := s.post(map[string]any{"jsonrpc": "2.0", "id": s.id, "method": "tools/call", "params": map[string]any{
		"name": "trigger-long-running-operation", "arguments": map[string]any{"duration": 2, "steps": 4},
		"_meta": map[string]any{"progressToken": "drop-1"}}})
	first, ok := newEventReader(resp).next()
	require.True(t, ok)
	require.Contains(t, first.data, `"progress":1`)
	require.NotEmpty(t, first.id)
	resp.Body.Close() // the sandbox's connection drops

	resumed := resumeStream(t, s, h.URL(), first.id)
	defer resumed.Body.Close()
	require.Equal(t, http.StatusOK, resumed.StatusCode)
	rest := newEventReader(resumed).untilResult()
	require.NotEmpty(t, rest)
	var progress []string
	for _, ev := range rest[:len(rest)-1] {
		var n rpcNotification
		require.NoError(t, json.Unmarshal([]byte(ev.data), &n))
		progress = append(progress, fmt.Sprint(n.Params["progress"]))
	}
	assert.Equal(t, []string{"2", "3", "4"}, progress, "the rest of the progress, in order")
	result := resultOf(t, rest[len(rest)-1].data)
	assert.Contains(t, result, "Long running operation completed")
	assert.NotContains(t, result, "isError")
}

// The log messages an upstream sends during a call reach the sandbox on that call's stream, all
// of them, in the order sent, before the result, even while the sandbox keeps its session's GET
// stream open (as TypeScript clients do), where none of them may land.
func TestCallLogMessagesKeepTheirOrderAndStream(t *testing.T) {
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "everything", URL: references(t).startGo(t), Prefix: config.PrefixNever})
	h.waitReady(t)
	s := openRawSession(t, h.URL(), "127.0.0.2")
	s.call("logging/setLevel", map[string]any{"level": "debug"})
	listening := openListeningStream(t, s)
	want := []string{"Tool execution started", "Tool processing data", "Tool execution completed"}
	for i := range 5 {
		_, notes := s.callStream("tools/call", map[string]any{"name": "test_tool_with_logging", "arguments": map[string]any{}})
		var logs []string
		for _, n := range notes {
			if n.Method == string(mcp.MethodNotificationMessage) {
				logs = append(logs, fmt.Sprint(n.Params["data"]))
			}
		}
		require.Equal(t, want, logs, "call %d: the call's stream carries its log messages in order", i)
	}
	assert.Empty(t, listening.messages(string(mcp.MethodNotificationMessage)), "none reached the GET stream")
}

// A log message an upstream sends outside any call (on its session's GET stream) reaches the
// sandbox whose upstream session it is, on the sandbox's GET stream.
func TestLogOutsideACallReachesTheSandboxStream(t *testing.T) {
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "everything", URL: references(t).startTS(t), Prefix: config.PrefixNever})
	h.waitReady(t)
	s := openRawSession(t, h.URL(), "127.0.0.2")
	s.call("logging/setLevel", map[string]any{"level": "debug"})
	listening := openListeningStream(t, s)
	_, notes := s.callStream("tools/call", map[string]any{"name": "toggle-simulated-logging", "arguments": map[string]any{}})
	for _, n := range notes {
		assert.NotEqual(t, string(mcp.MethodNotificationMessage), n.Method, "the upstream sent it outside the call")
	}
	logs := listening.await(t, string(mcp.MethodNotificationMessage))
	assert.Regexp(t, `(?i)level.message`, fmt.Sprint(logs[0].Params["data"]), "one of its simulated log messages")
}

// Each sandbox session's upstream session declares the sandbox's own client capabilities, so
// the upstream lists the tools that need sampling, elicitation or roots to a sandbox that has
// them, and not to one that has not.
func TestToolsNeedingACapabilityAreListedOnlyToSandboxesWithIt(t *testing.T) {
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "everything", URL: references(t).startTS(t), Prefix: config.PrefixNever})
	h.waitReady(t)
	needing := []string{"get-roots-list", "trigger-elicitation-request", "trigger-sampling-request"}
	bare := connectListeningSandbox(t, h.URL(), "127.0.0.2", sandboxOptions{})
	capable := connectListeningSandbox(t, h.URL(), "127.0.0.1", sandboxOptions{roots: fixedRoots{},
		sampling: &samplingClient{answer: "hi"}, elicitation: &inputSandbox{}})
	bareTools, capableTools := bare.toolNames(t), capable.toolNames(t)
	for _, name := range needing {
		assert.NotContains(t, bareTools, name, "a sandbox without the capability does not see %s", name)
		assert.Contains(t, capableTools, name, "a sandbox with the capability sees %s", name)
	}
	assert.Contains(t, bareTools, "echo")
}

// listeningStream is a raw sandbox's GET stream, read in the background.
type listeningStream struct {
	events chan rpcNotification
	mu     chan struct{}
	seen   []rpcNotification
}

func openListeningStream(t *testing.T, s *rawSession) *listeningStream {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, s.url, nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", s.sid)
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	resp, err := s.hc.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	l := &listeningStream{events: make(chan rpcNotification, 64), mu: make(chan struct{}, 1)}
	l.mu <- struct{}{}
	go func() {
		defer resp.Body.Close()
		defer close(l.events)
		rd := sse.NewReader(resp.Body, 1<<20)
		for {
			ev, err := rd.Next()
			if err != nil {
				return
			}
			var n rpcNotification
			if json.Unmarshal(ev.Data, &n) == nil && n.Method != "" {
				l.events <- n
			}
		}
	}()
	t.Cleanup(func() { resp.Body.Close() })
	return l
}

// drain moves what arrived so far into seen.
func (l *listeningStream) drain() {
	for {
		select {
		case n, ok := <-l.events:
			if !ok {
				return
			}
			l.seen = append(l.seen, n)
		default:
			return
		}
	}
}

func (l *listeningStream) messages(method string) []rpcNotification {
	<-l.mu
	defer func() { l.mu <- struct{}{} }()
	l.drain()
	var out []rpcNotification
	for _, n := range l.seen {
		if n.Method == method {
			out = append(out, n)
		}
	}
	return out
}

// await waits (up to a generous deadline) for a message of method on the stream.
func (l *listeningStream) await(t *testing.T, method string) []rpcNotification {
	t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		if got := l.messages(method); len(got) > 0 {
			return got
		}
		select {
		case n, ok := <-l.events:
			if !ok {
				t.Fatalf("the GET stream ended before a %s", method)
			}
			<-l.mu
			l.seen = append(l.seen, n)
			l.mu <- struct{}{}
		case <-deadline:
			t.Fatalf("no %s on the GET stream", method)
		}
	}
}

var _ = strings.Contains

// holds reports whether the store recorded, for session sid, an event carrying method: what
// the gateway sends a sandbox on any stream is recorded before it is written.
func holds(s *mcpsessions.Events, sid, method string) bool {
	for _, e := range s.Recorded(sid) {
		var m struct {
			Method string `json:"method"`
		}
		if json.Unmarshal(e.Message, &m) == nil && m.Method == method {
			return true
		}
	}
	return false
}
