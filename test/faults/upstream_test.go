package faults

import (
	"bytes"
	"context"
	"fmt"
	"io"
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

	"github.com/sandgate/sandgate/audit"
)

// upstream is a Streamable HTTP MCP server named like the shipped policy's "everything":
// echo returns its message, long-op takes slow and signals entered when it starts. A tools/call
// whose body holds "boom-500" is answered 500, one holding "boom-garbage" 200 with a body that
// is not JSON-RPC: the faults an upstream can answer one sandbox's call with.
type upstream struct {
	URL     string
	entered chan struct{}
	srv     *httptest.Server
}

// kill takes the upstream down the way a crashed server goes: its port refuses connections and
// the open ones are cut.
func (u *upstream) kill() {
	_ = u.srv.Listener.Close()
	u.srv.CloseClientConnections()
}

func startUpstream(t *testing.T, name string, slow time.Duration) *upstream {
	t.Helper()
	u := &upstream{entered: make(chan struct{}, 100)}
	s := server.NewMCPServer(name, "1", server.WithToolCapabilities(false))
	if name == "github" {
		s.AddTool(mcp.NewTool("get_issue", mcp.WithNumber("issue_number")), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText("issue 1"), nil
		})
	} else {
		addEverythingTools(s, u, slow)
	}
	h := server.NewStreamableHTTPServer(s, server.WithStateful(true))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch {
		case bytes.Contains(body, []byte("boom-500")):
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		case bytes.Contains(body, []byte("boom-garbage")):
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`}{ not json-rpc`))
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		h.ServeHTTP(w, r)
	}))
	u.srv = srv
	t.Cleanup(func() { u.kill(); srv.Close() })
	u.URL = srv.URL + "/mcp"
	return u
}

// addEverythingTools adds echo and long-op.
func addEverythingTools(s *server.MCPServer, u *upstream, slow time.Duration) {
	s.AddTool(mcp.NewTool("echo", mcp.WithString("message")), func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText(req.GetString("message", "")), nil
	})
	s.AddTool(mcp.NewTool("long-op"), func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		u.entered <- struct{}{}
		select {
		case <-time.After(slow): // the tool's work, not a synchronisation
			return mcp.NewToolResultText("done"), nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
}

func upstreamsConfig(urls ...string) string {
	names := []string{"everything", "github"}
	out := "gateway:\n  upstreams:\n"
	for i, u := range urls {
		out += fmt.Sprintf("    - {name: %s, url: %q, prefix: never, connect_timeout: 2s}\n", names[i], u)
	}
	return out
}

// TestDrainUnderASlowTool: SIGTERM while 10 calls of a 2s tool run: every call is answered
// with the tool's result, sandgate exits 0, and each call has its event.
func TestDrainUnderASlowTool(t *testing.T) {
	up := startUpstream(t, "everything", 2*time.Second)
	g := startGate(t, upstreamsConfig(up.URL))
	const calls = 10
	sandboxes := []*sandbox{g.connect(coder1), g.connect(coder2)}
	type result struct {
		ok   bool
		text string
		err  error
	}
	results := make(chan result, calls)
	for i := range calls {
		go func() {
			ok, text, err := sandboxes[i%2].call("long-op", nil)
			results <- result{ok, text, err}
		}()
	}
	for range calls {
		select {
		case <-up.entered:
		case <-time.After(wait):
			t.Fatal("the calls did not reach the upstream")
		}
	}
	start := time.Now()
	require.NoError(t, g.cmd.Process.Signal(sigterm))
	for range calls {
		r := <-results
		require.NoError(t, r.err)
		assert.True(t, r.ok, r.text)
		assert.Equal(t, "done", r.text)
	}
	select {
	case <-g.exited:
	case <-time.After(wait):
		t.Fatal("sandgate did not exit after draining")
	}
	t.Logf("drain: %d calls of a 2s tool answered, exit %d after %s", calls, g.exitCode, time.Since(start).Round(time.Millisecond))
	assert.Equal(t, 0, g.exitCode)
	evs := g.events()
	g.requireOneEventPerAnswer(evs)
	for _, ev := range evs {
		if ev.Kind == audit.KindToolsCall {
			assert.Equal(t, 200, ev.Outcome.Status, "a drained call is answered, not cut: %+v", ev.Outcome)
		}
	}
}

// TestReadyWithOneUpstreamDown: of two upstreams one goes down (killed: its port refuses): the
// replica stays ready, reports the upstream as degraded, serves the other one's tools, and
// answers the down one's tools with upstream_unavailable.
func TestReadyWithOneUpstreamDown(t *testing.T) {
	up, down := startUpstream(t, "everything", 0), startUpstream(t, "github", 0)
	g := startGate(t, upstreamsConfig(up.URL, down.URL))
	s := g.connect(coder1)
	ok, text, err := s.call("get_issue", map[string]any{"issue_number": 1})
	require.NoError(t, err)
	require.True(t, ok, "github serves before it goes down: %s", text)
	down.kill()
	var body map[string]any
	g.eventually("github reported degraded", func() bool {
		var code int
		code, body = g.readyz()
		require.Equal(t, http.StatusOK, code, "ready while one upstream is down: %v", body)
		return strings.Contains(fmt.Sprint(body["degraded"]), "github")
	})
	for range 5 {
		ok, text, err := s.call("echo", map[string]any{"message": "hi"})
		require.NoError(t, err)
		assert.True(t, ok)
		assert.Equal(t, "hi", text)
	}
	ok, text, err = s.call("get_issue", map[string]any{"issue_number": 1})
	require.NoError(t, err)
	assert.False(t, ok, text)
	code, _ := g.readyz()
	assert.Equal(t, http.StatusOK, code, "still ready after calls to the down upstream")
	evs := g.events()
	g.requireOneEventPerAnswer(evs)
	var unavailable int
	for _, ev := range evs {
		if ev.Kind == audit.KindToolsCall && ev.Target.Upstream == "github" && ev.Outcome.Error != "" {
			assert.Equal(t, "upstream_unavailable", ev.Outcome.Error, "%+v", ev)
			unavailable++
		}
	}
	assert.Equal(t, 1, unavailable, "the call after github went down")
}

// TestOneSandboxsUpstreamErrorsStayItsOwn: the upstream answers every call of coder-1 with a 500
// or garbage, while coder-2 calls the same upstream's tool: coder-2 gets no error at all.
func TestOneSandboxsUpstreamErrorsStayItsOwn(t *testing.T) {
	up := startUpstream(t, "everything", 0)
	g := startGate(t, upstreamsConfig(up.URL))
	bad, good := g.connect(coder1), g.connect(coder2)
	const calls = 30
	var wg sync.WaitGroup
	var badAnswered int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range calls {
			msg := []string{"boom-500", "boom-garbage"}[i%2]
			if ok, _, err := bad.call("echo", map[string]any{"message": msg}); err == nil && !ok {
				badAnswered++
			}
		}
	}()
	var goodErrors []string
	for i := range calls {
		want := fmt.Sprintf("fine-%d", i)
		ok, text, err := good.call("echo", map[string]any{"message": want})
		if err != nil || !ok || text != want {
			goodErrors = append(goodErrors, fmt.Sprintf("call %d: ok=%t text=%q err=%v", i, ok, text, err))
		}
	}
	wg.Wait()
	assert.Empty(t, goodErrors, "coder-2's calls on the upstream that fails coder-1's")
	assert.Equal(t, calls, badAnswered, "each of coder-1's calls is answered with an error result")
	evs := g.events()
	g.requireOneEventPerAnswer(evs)
	for _, ev := range evs {
		if ev.Kind == audit.KindToolsCall && ev.Identity.Sandbox == "coder-2" {
			assert.Empty(t, ev.Outcome.Error, "%+v", ev.Outcome)
		}
	}
}
