package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/config"
)

// startTaskUpstream serves an mcp-go server (revision 2025-11-25) whose tool "long" may run as
// a task of the upstream's; seen counts the task requests (tasks/*) that reached it.
func startTaskUpstream(t *testing.T, seen *atomic.Int64) string {
	t.Helper()
	s := server.NewMCPServer("tasks", "1", server.WithTaskCapabilities(true, true, true), server.WithToolCapabilities(true))
	s.AddTaskTool(mcp.NewTool("long", mcp.WithTaskSupport(mcp.TaskSupportOptional)),
		func(context.Context, mcp.CallToolRequest) (*mcp.CreateTaskResult, error) {
			return &mcp.CreateTaskResult{}, nil
		})
	h := server.NewStreamableHTTPServer(s, server.WithStateful(true), server.WithDisableStreaming(true))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if bytes.Contains(body, []byte(`"method":"tasks/`)) {
			seen.Add(1)
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp"
}

// A task is the upstream's, relayed, never one Sandgate makes, and belongs to the sandbox that
// made it: its tasks/get and tasks/result go to the upstream for that sandbox; another sandbox's
// tasks/get, tasks/result and tasks/cancel are answered as for a task that does not exist,
// audited, and never reach the upstream; tasks/list lists a sandbox's own.
func TestTasksBelongToTheSandboxThatMadeThem(t *testing.T) {
	var seen atomic.Int64
	h := startGateway(t, "testdata/policy", config.Upstream{Name: "http", URL: startTaskUpstream(t, &seen), Prefix: config.PrefixNever,
		ProtocolVersion: mcp.LATEST_LEGACY_PROTOCOL_VERSION}) // the 2025-11-25 tasks model
	h.waitReady(t)
	init := openRawSession(t, h.URL(), "127.0.0.2").call("initialize", map[string]any{"protocolVersion": "2025-11-25",
		"capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "raw", "version": "1"}})
	assert.Contains(t, string(init), `"tasks":`, "an upstream that offers tasks makes Sandgate offer them")
	owner, other := openRawSession(t, h.URL(), "127.0.0.2"), openRawSession(t, h.URL(), "127.0.0.1")

	made := owner.call("tools/call", map[string]any{"name": "long", "arguments": map[string]any{}, "task": map[string]any{"ttl": 60000}})
	var created struct {
		Task struct {
			TaskID string `json:"taskId"`
			Status string `json:"status"`
		} `json:"task"`
	}
	require.NoError(t, json.Unmarshal(made, &created), "%s", made)
	id := created.Task.TaskID
	require.NotEmpty(t, id, "the upstream's task: %s", made)

	got := owner.call("tasks/get", map[string]any{"taskId": id})
	assert.Contains(t, string(got), id, "the owner reads its task")
	reached := seen.Load()
	for _, method := range []string{"tasks/get", "tasks/result", "tasks/cancel"} {
		_, rpcErr, _ := other.exchange(method, map[string]any{"taskId": id})
		require.NotNil(t, rpcErr, "another sandbox's %s is refused", method)
		assert.Contains(t, string(rpcErr), `"code":-32602`, method)
	}
	assert.Equal(t, reached, seen.Load(), "no refused task request reached the upstream")

	var mine, theirs struct {
		Tasks []struct {
			TaskID string `json:"taskId"`
		} `json:"tasks"`
	}
	require.NoError(t, json.Unmarshal(owner.call("tasks/list", nil), &mine))
	require.NoError(t, json.Unmarshal(other.call("tasks/list", nil), &theirs))
	require.Len(t, mine.Tasks, 1)
	assert.Equal(t, id, mine.Tasks[0].TaskID)
	assert.Empty(t, theirs.Tasks, "a sandbox lists none of another's tasks")

	refused := 0
	for _, ev := range eventsOf(t, h, audit.KindTasks, 6) {
		if ev.Outcome.Error == call.CodeNotFound && ev.Identity.SourceIP == "127.0.0.1" {
			refused++
		}
	}
	assert.Equal(t, 3, refused, "each refused task request is audited")
}
