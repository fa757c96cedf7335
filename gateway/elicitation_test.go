package gateway

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/internal/config"
)

// An upstream's elicitation during a call, against the TypeScript reference server, whose
// trigger-elicitation-request asks for a form of many fields in an order of its own (name,
// check, firstLine, email, …): the sandbox reads the request as the upstream wrote it, so its
// requestedSchema keeps the upstream's key order (a sorted one reorders the form's fields),
// and the sandbox's accepting it is no error in Sandgate's log.
func TestElicitationReachesTheSandboxAsWritten(t *testing.T) {
	url := references(t).startTS(t)
	var logs lockedBuffer
	h := startGatewayWith(t, "testdata/policy", func(o *Options) {
		o.Log = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}, config.Upstream{Name: "everything", URL: url, Prefix: config.PrefixNever})
	h.waitReady(t)
	answer := map[string]any{"action": "accept", "content": map[string]any{"name": "Ada", "check": true}}

	directAsked, directRes := openElicitingSession(t, url, "127.0.0.1").callAnswering("trigger-elicitation-request", answer)
	asked, res := openElicitingSession(t, h.URL(), "127.0.0.2").callAnswering("trigger-elicitation-request", answer)
	require.Len(t, directAsked, 1)
	require.Len(t, asked, 1, "the upstream's elicitation reached the sandbox")
	want, got := resultMember(t, directAsked[0], "requestedSchema"), resultMember(t, asked[0], "requestedSchema")
	assert.Equal(t, string(want), string(got), "requestedSchema as the upstream wrote it, keys in its order")
	assert.Contains(t, string(got), `"properties":{"name":`, "the upstream's first field first (sorted, birthdate would be)")
	assert.Contains(t, string(directRes), `\"action\": \"accept\"`)
	assert.Contains(t, string(res), `\"action\": \"accept\"`, "the upstream got the sandbox's answer")

	// A typed client that keeps its GET stream open (as TypeScript clients do) accepts too.
	accepting := &inputSandbox{elicited: &mcp.ElicitationResult{ElicitationResponse: mcp.ElicitationResponse{
		Action: mcp.ElicitationResponseActionAccept, Content: map[string]any{"name": "Ada"}}}}
	s := connectListeningSandbox(t, h.URL(), "127.0.0.2", sandboxOptions{elicitation: accepting})
	typed, err := callTool(t, s.Client, "trigger-elicitation-request", map[string]any{})
	require.NoError(t, err)
	assert.False(t, typed.IsError, resultText(typed))
	assert.Equal(t, int32(1), accepting.calls.Load())

	assert.NotContains(t, logs.String(), "level=ERROR", "an elicitation answered is no error")
}

// openElicitingSession is a raw sandbox session whose client declares elicitation.
func openElicitingSession(t *testing.T, url, src string) *rawSession {
	t.Helper()
	s := &rawSession{t: t, url: url, hc: sandboxHTTPClient(src, nil)}
	s.call("initialize", map[string]any{"protocolVersion": "2025-06-18", "capabilities": map[string]any{"elicitation": map[string]any{}},
		"clientInfo": map[string]any{"name": "raw", "version": "1"}})
	s.post(map[string]any{"jsonrpc": "2.0", "method": "notifications/initialized"}).Body.Close()
	return s
}

// callAnswering calls tool, answers each elicitation/create its stream carries with answer, and
// returns the params of those requests as the sandbox read them, and the call's result.
func (s *rawSession) callAnswering(tool string, answer any) (asked []json.RawMessage, result json.RawMessage) {
	s.t.Helper()
	s.id++
	resp := s.post(map[string]any{"jsonrpc": "2.0", "id": s.id, "method": "tools/call",
		"params": map[string]any{"name": tool, "arguments": map[string]any{}}})
	defer resp.Body.Close()
	require.Equal(s.t, http.StatusOK, resp.StatusCode)
	events := newEventReader(resp)
	for {
		ev, ok := events.next()
		require.True(s.t, ok, "the call's stream ended without its result")
		var m struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params json.RawMessage `json:"params"`
			Result json.RawMessage `json:"result"`
		}
		require.NoError(s.t, json.Unmarshal([]byte(ev.data), &m))
		switch {
		case m.Method == "elicitation/create":
			asked = append(asked, m.Params)
			r := s.post(map[string]any{"jsonrpc": "2.0", "id": m.ID, "result": answer})
			r.Body.Close()
			require.Equal(s.t, http.StatusAccepted, r.StatusCode)
		case m.Method == "" && bytes.Equal(m.ID, []byte(strconv.Itoa(s.id))):
			return asked, m.Result
		}
	}
}
