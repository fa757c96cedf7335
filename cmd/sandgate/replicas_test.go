package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/test/redistest"
)

// Source addresses of the sandboxes of the replica tests (config identity.static below).
const (
	coderAddr   = "127.0.0.2" // agents/coder-1, coding-agent
	triageAddr  = "127.0.0.3" // agents/triage-1, triage-agent: 3 requests/minute
	spenderAddr = "127.0.0.4" // agents/coder-2, coding-agent: spends its token budget
	adminToken  = "admin-token-for-tests"
)

// replica is one in-process "sandgate serve" of a replica test.
type replica struct {
	name, mcp, proxy, admin, auditDir string
	// stop ends the replica and waits for it (the test's cleanup calls it too).
	stop func()
}

// startReplica runs "sandgate serve" exactly as main does, sharing redisAddr, until the test ends.
func startReplica(t *testing.T, name, redisAddr, githubURL, modelURL string) *replica {
	t.Helper()
	// Generous bounds: a stopped Redis refuses at once, so no subtest waits on them, while a busy
	// machine (go test -p 4 in make test) once held a round trip past the 200ms these were, and
	// replica b answered a session hand-over "unknown session" (404).
	return startReplicaOn(t, name, fmt.Sprintf("{addr: %q, op_timeout: 5s, dial_timeout: 5s}", redisAddr),
		"{triage-agent: {requests_per_minute: 3}, coding-agent: {tokens_per_day: 50}}", githubURL, modelURL)
}

// startReplicaOn is startReplica with the config's redis section and limits.templates given (YAML
// flow style).
func startReplicaOn(t *testing.T, name, redisYAML, templatesYAML, githubURL, modelURL string) *replica {
	t.Helper()
	dir := t.TempDir()
	r := &replica{name: name, mcp: freeAddr(t), proxy: freeAddr(t), admin: freeAddr(t), auditDir: filepath.Join(dir, "audit")}
	writeFile(t, dir, "admin-token", adminToken)
	writeFile(t, dir, "anthropic", "sk-ant-test-value")
	cfg := writeFile(t, dir, "sandgate.yaml", fmt.Sprintf(`listen: {mcp: %q, proxy: %q, admin: %q}
policy: {dir: %q}
audit: {file: {dir: %q, fsync: never}}
shutdown: {delay: 0s}
credentials:
  - {name: admin-token, file: admin-token}
  - {name: anthropic, file: anthropic}
admin: {token_credential: admin-token}
redis: %s
limits: {templates: %s}
gateway:
  upstreams:
    - {name: github, url: %q, prefix: never}
proxy:
  routes:
    - {name: anthropic, upstream: %q, api: anthropic, allow_private: true,
       credential: {name: anthropic, header: x-api-key, format: "{value}"}}
identity:
  static:
    - {addresses: [%q], namespace: agents, sandbox: coder-1, template: coding-agent}
    - {addresses: [%q], namespace: agents, sandbox: triage-1, template: triage-agent}
    - {addresses: [%q], namespace: agents, sandbox: coder-2, template: coding-agent}
log: {level: warn, format: text}
`, r.mcp, r.proxy, r.admin, repoPath(t, "policies"), r.auditDir, redisYAML, templatesYAML, githubURL, modelURL,
		coderAddr, triageAddr, spenderAddr))
	ctx, cancel := context.WithCancel(context.Background())
	var errOut syncBuffer
	done := make(chan int, 1)
	env := &cliEnv{stdout: io.Discard, stderr: &errOut, now: pinnedClock, getenv: func(k string) string {
		if k == "SANDGATE_REPLICA" {
			return name
		}
		return ""
	}}
	go func() { done <- run(ctx, env, []string{"serve", "--config", cfg}) }()
	t.Cleanup(func() {
		if t.Failed() { // what the replica logged (warnings and up) explains most failures
			t.Logf("replica %s log:\n%s", name, errOut.String())
		}
	})
	r.stop = sync.OnceFunc(func() {
		cancel()
		select {
		case code := <-done:
			assert.Equal(t, 0, code, "replica %s: %s", name, errOut.String())
		case <-time.After(20 * time.Second):
			t.Errorf("replica %s did not stop", name)
		}
	})
	t.Cleanup(r.stop)
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + r.admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}, 30*time.Second, 50*time.Millisecond, "replica %s not ready: %s", name, errOut.String())
	return r
}

// fromAddr is an HTTP client whose connections come from src, the sandbox's identity.
func fromAddr(src string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext}, Timeout: 20 * time.Second}
}

// mcpSession initializes an MCP session with the replica's /mcp from src.
func (r *replica) mcpSession(t *testing.T, src string) *client.Client {
	t.Helper()
	c, err := client.NewStreamableHttpClient("http://"+r.mcp+"/mcp", transport.WithHTTPBasicClient(fromAddr(src)))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, c.Start(ctx))
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_LEGACY_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "replica-test", Version: "1"}
	_, err = c.Initialize(ctx, init)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// callTool calls a tool and returns whether it succeeded and its text.
func callTool(t *testing.T, c *client.Client, name string, args map[string]any) (ok bool, text string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := mcp.CallToolRequest{}
	req.Params.Name, req.Params.Arguments = name, args
	res, err := c.CallTool(ctx, req)
	require.NoError(t, err)
	for _, ct := range res.Content {
		if tc, isText := ct.(mcp.TextContent); isText {
			text += tc.Text
		}
	}
	return !res.IsError, text
}

// githubUpstream is a Streamable HTTP MCP server named like the shipped policy's "github".
func githubUpstream(t *testing.T) string {
	s := server.NewMCPServer("github", "1", server.WithToolCapabilities(false))
	reply := func(text string) server.ToolHandlerFunc {
		return func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(text), nil
		}
	}
	s.AddTool(mcp.NewTool("get_issue"), reply("issue 1"))
	s.AddTool(mcp.NewTool("create_pull_request", mcp.WithString("owner"), mcp.WithString("repo")), reply("pull request created"))
	ts := httptest.NewServer(server.NewStreamableHTTPServer(s, server.WithStateful(true)))
	t.Cleanup(ts.Close)
	return ts.URL + "/mcp"
}

// modelAPI answers Anthropic Messages: JSON with 15 tokens of usage, or (stream: true) an SSE
// stream whose message_start reports 60 input tokens, followed by five more events.
func modelAPI(t *testing.T) string {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !bytes.Contains(body, []byte(`"stream":true`)) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"type":"message","content":[],"usage":{"input_tokens":10,"output_tokens":5}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		_, _ = io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":60,\"output_tokens\":1}}}\n\n")
		fl.Flush()
		for i := range 5 {
			time.Sleep(20 * time.Millisecond)
			if _, err := fmt.Fprintf(w, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":%d}\n\n", i); err != nil {
				return
			}
			fl.Flush()
		}
		_, _ = io.WriteString(w, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	}))
	t.Cleanup(ts.Close)
	return ts.URL
}

// modelRequest posts a Messages request through the replica's /routes/anthropic from src.
func (r *replica) modelRequest(t *testing.T, src string, stream bool) (int, string) {
	t.Helper()
	body := fmt.Sprintf(`{"model":"claude-haiku-4-5","max_tokens":100,"stream":%t,"messages":[]}`, stream)
	resp, err := fromAddr(src).Post("http://"+r.proxy+"/routes/anthropic/v1/messages", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (r *replica) putGrant(t *testing.T, path, body, token string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPut, "http://"+r.admin+"/v1/grants/"+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

// fileEventIDs is the set of event IDs in a replica's audit file.
func fileEventIDs(t *testing.T, dir string) map[string]audit.Event {
	t.Helper()
	res, err := audit.Query(context.Background(), dir, audit.Filter{Limit: -1})
	require.NoError(t, err)
	out := map[string]audit.Event{}
	for _, ev := range res.Events {
		out[ev.ID] = ev
	}
	return out
}

// countKind counts the events of one kind (every request is an event: initialize,
// notifications and streams too).
func countKind(evs map[string]audit.Event, kind audit.Kind) int {
	n := 0
	for _, ev := range evs {
		if ev.Kind == kind {
			n++
		}
	}
	return n
}

// balancer plays the Service in front of the replicas: it forwards to the replica chosen last,
// connecting from src as kube-proxy keeps the client's address.
type balancer struct {
	target atomic.Pointer[string]
	url    string
}

func newBalancer(t *testing.T, src string) *balancer {
	b := &balancer{}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			u, _ := url.Parse("http://" + *b.target.Load())
			pr.SetURL(u)
		},
		Transport:     fromAddr(src).Transport,
		FlushInterval: -1,
	}
	ts := httptest.NewServer(rp)
	t.Cleanup(ts.Close)
	b.url = ts.URL + "/mcp"
	return b
}

func (b *balancer) to(r *replica) { b.target.Store(&r.mcp) }

// TestReplicasShareState runs two replicas of "sandgate serve" on one real redis-server and
// checks that what they share behaves as one gateway would.
func TestReplicasShareState(t *testing.T) {
	srv := redistest.Start(t)
	github, model := githubUpstream(t), modelAPI(t)
	a := startReplica(t, "replica-a", srv.Addr, github, model)
	b := startReplica(t, "replica-b", srv.Addr, github, model)
	rdb := srv.Client(t)

	t.Run("requests per minute of a template are counted across both replicas", func(t *testing.T) {
		onA, onB := a.mcpSession(t, triageAddr), b.mcpSession(t, triageAddr)
		for i, c := range []*client.Client{onA, onB, onA} {
			ok, text := callTool(t, c, "get_issue", nil)
			require.True(t, ok, "call %d: %s", i+1, text)
		}
		ok, text := callTool(t, onB, "get_issue", nil)
		assert.False(t, ok)
		assert.Contains(t, text, "rate limit of 3 requests/minute for sandbox agents/triage-1")
	})

	t.Run("a grant registered on one replica is honoured by the other", func(t *testing.T) {
		onB := b.mcpSession(t, coderAddr)
		args := map[string]any{"owner": "acme", "repo": "api"}
		ok, text := callTool(t, onB, "create_pull_request", args)
		require.False(t, ok, text)
		assert.Contains(t, text, `repository "acme/api" is not granted`)

		assert.Equal(t, http.StatusUnauthorized, a.putGrant(t, "agents/coder-1/github_repos", `{"value":["acme/api"],"ttl":"10m"}`, "wrong"))
		require.Equal(t, http.StatusOK, a.putGrant(t, "agents/coder-1/github_repos", `{"value":["acme/api"],"ttl":"10m"}`, adminToken))
		ok, text = callTool(t, onB, "create_pull_request", args)
		assert.True(t, ok, text)
		ok, text = callTool(t, onB, "create_pull_request", map[string]any{"owner": "acme", "repo": "billing"})
		assert.False(t, ok, text)
	})

	t.Run("a token budget spent in a stream on one replica ends the stream and refuses on the other", func(t *testing.T) {
		status, body := a.modelRequest(t, spenderAddr, true)
		require.Equal(t, 200, status, body)
		assert.Contains(t, body, "message_start")
		assert.NotContains(t, body, "content_block_delta", "the stream goes on after the budget is spent")
		status, body = b.modelRequest(t, spenderAddr, false)
		assert.Equal(t, http.StatusTooManyRequests, status, body)
		assert.Contains(t, body, "token budget of 50/day for sandbox agents/coder-2")
		require.Eventually(t, func() bool {
			for _, ev := range fileEventIDs(t, a.auditDir) {
				if ev.Identity.Sandbox == "coder-2" && ev.Outcome.Error == "token_budget_spent" && ev.Outcome.TokensIn == 60 {
					return true
				}
			}
			return false
		}, 10*time.Second, 50*time.Millisecond, "the cut stream's audit event says why")
	})

	t.Run("the audit stream holds the events of both replicas", func(t *testing.T) {
		status, body := a.modelRequest(t, coderAddr, false)
		require.Equal(t, 200, status, body)
		var inStream map[string]bool
		require.Eventually(t, func() bool {
			res, err := audit.QueryRedis(context.Background(), rdb, "sandgate:audit", audit.Filter{Limit: -1})
			if err != nil {
				return false
			}
			inStream = map[string]bool{}
			for _, ev := range res.Events {
				inStream[ev.ID] = true
			}
			for _, r := range []*replica{a, b} {
				ids := fileEventIDs(t, r.auditDir)
				if len(ids) == 0 {
					return false
				}
				for id := range ids {
					if !inStream[id] {
						return false
					}
				}
			}
			return true
		}, 15*time.Second, 100*time.Millisecond, "every event of both files reaches the stream")
		for _, r := range []*replica{a, b} {
			n, err := rdb.Exists(context.Background(), audit.ReplicaStream("sandgate:audit", r.name)+":mirrored").Result()
			require.NoError(t, err)
			assert.Equal(t, int64(1), n, "replica %s mirrors under its own source", r.name)
		}
		code, out, stderr := auditCLI(t, "query", "--redis", srv.Addr, "--sandbox", "triage-1", "--kind", "mcp.tools_call", "--limit", "100", "-o", "json")
		require.Equal(t, 0, code, stderr)
		assert.Equal(t, 4, strings.Count(out, "\n"), "the four calls of triage-1 on both replicas: %s", out)
	})

	t.Run("while redis is down budgets fail closed, the file keeps every event and the stream catches up", func(t *testing.T) {
		onA := a.mcpSession(t, coderAddr)
		before := countKind(fileEventIDs(t, a.auditDir), audit.KindToolsCall)
		srv.Stop()
		ok, text := callTool(t, onA, "create_pull_request", map[string]any{"owner": "acme", "repo": "api"})
		assert.False(t, ok, text)
		assert.Contains(t, text, "rate limit store unavailable")
		status, body := b.modelRequest(t, coderAddr, false)
		assert.Equal(t, http.StatusServiceUnavailable, status, body)
		assert.Contains(t, body, "rate limit store unavailable")

		resp, err := http.Get("http://" + a.admin + "/readyz")
		require.NoError(t, err)
		rb, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, 200, resp.StatusCode, "redis trouble leaves the replica ready: %s", rb)
		assert.Contains(t, string(rb), `"degraded"`)

		var outage []string
		require.Eventually(t, func() bool {
			outage = outage[:0]
			for id, ev := range fileEventIDs(t, a.auditDir) {
				if strings.Contains(ev.Decision.Reason, "rate limit store unavailable") {
					outage = append(outage, id)
				}
			}
			return len(outage) == 1 && countKind(fileEventIDs(t, a.auditDir), audit.KindToolsCall) == before+1
		}, 10*time.Second, 50*time.Millisecond, "the denied call is in the file")

		srv.Restart()
		require.Eventually(t, func() bool {
			res, err := audit.QueryRedis(context.Background(), rdb, "sandgate:audit", audit.Filter{Limit: -1})
			if err != nil {
				return false
			}
			for _, ev := range res.Events {
				if ev.ID == outage[0] {
					return true
				}
			}
			return false
		}, 20*time.Second, 100*time.Millisecond, "the event written during the outage reaches the stream")
		ok, text = callTool(t, onA, "get_issue", nil)
		assert.True(t, ok, "budgets work again once redis is back: %s", text)
	})

	t.Run("an MCP session continues on the other replica, also once its own replica is stopped", func(t *testing.T) {
		lb := newBalancer(t, coderAddr)
		lb.to(a)
		c := sessionThrough(t, lb)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		ok, text := callTool(t, c, "get_issue", nil)
		require.True(t, ok, text)

		lb.to(b)
		ok, text = callTool(t, c, "get_issue", nil)
		assert.True(t, ok, "the session continues on replica b: %s", text)
		a.stop()
		tools, err := c.ListTools(ctx, mcp.ListToolsRequest{})
		require.NoError(t, err, "the session lives on with replica a gone")
		assert.NotEmpty(t, tools.Tools)

		// The session stays bound to the address that created it, on every replica.
		sid := c.GetSessionId()
		require.NotEmpty(t, sid)
		req, _ := http.NewRequest(http.MethodPost, "http://"+b.mcp+"/mcp",
			strings.NewReader(`{"jsonrpc":"2.0","id":7,"method":"tools/list"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Mcp-Protocol-Version", mcp.LATEST_LEGACY_PROTOCOL_VERSION)
		resp, err := fromAddr(triageAddr).Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusNotFound, resp.StatusCode, "another sandbox cannot use the session")
	})

	t.Run("metrics show decisions by code, latencies, the audit queue and sessions", func(t *testing.T) {
		resp, err := http.Get("http://" + b.admin + "/metrics")
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, want := range []string{
			`sandgate_policy_decisions_total{`,
			`code="tool_allowed"`,
			`sandgate_limits_denied_total{code="rate_limited",kind="mcp.tools_call"}`,
			`sandgate_call_duration_seconds_bucket{allow="true",code="ok",kind="mcp.tools_call"`,
			`sandgate_call_duration_seconds_bucket{allow="false",code="token_budget_spent",kind="http.request"`,
			`sandgate_calls_total{allow="false",code="rate_limited",kind="mcp.tools_call"}`,
			`sandgate_audit_queue_depth `,
			`sandgate_audit_queue_capacity `,
			`sandgate_gateway_sessions `,
			`sandgate_shared_state_errors_total{store="limits"}`,
		} {
			assert.Contains(t, string(body), want)
		}
	})
}

// sessionThrough opens an initialized MCP session through the balancer lb (to whichever replica
// it points at now), closed when the test ends.
func sessionThrough(t *testing.T, lb *balancer) *client.Client {
	t.Helper()
	c, err := client.NewStreamableHttpClient(lb.url, transport.WithHTTPBasicClient(&http.Client{Timeout: 20 * time.Second}))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	require.NoError(t, c.Start(ctx))
	t.Cleanup(func() { c.Close() })
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_LEGACY_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "coder", Version: "1"}
	_, err = c.Initialize(ctx, init)
	require.NoError(t, err)
	return c
}
