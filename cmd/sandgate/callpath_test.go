package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
)

// Sources of the call-path test: a coding agent, a triage agent (2 requests a minute) and an
// address that is no sandbox.
const (
	cpCoder   = "127.0.0.2"
	cpTriage  = "127.0.0.3"
	cpUnknown = "127.0.0.9"
	cpMarker  = "127.0.0.50"
)

// richUpstream is an MCP server with tools, resources, a resource template and a prompt.
func richUpstream(t *testing.T) string {
	s := server.NewMCPServer("github", "1", server.WithToolCapabilities(false),
		server.WithResourceCapabilities(true, false), server.WithPromptCapabilities(false))
	s.AddTool(mcp.NewTool("get_issue"), func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("issue 1"), nil
	})
	s.AddTool(mcp.NewTool("create_pull_request", mcp.WithString("owner"), mcp.WithString("repo")),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText("created"), nil
		})
	text := func(uri string) server.ResourceHandlerFunc {
		return func(context.Context, mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
			return []mcp.ResourceContents{mcp.TextResourceContents{URI: uri, Text: "contents of " + uri}}, nil
		}
	}
	s.AddResource(mcp.NewResource("get_docs://readme", "readme"), text("get_docs://readme"))
	s.AddResource(mcp.NewResource("secret://keys", "keys"), text("secret://keys"))
	s.AddResourceTemplate(mcp.NewResourceTemplate("get_docs://files/{name}", "files"),
		func(_ context.Context, r mcp.ReadResourceRequest) ([]mcp.ResourceContents, error) {
			return []mcp.ResourceContents{mcp.TextResourceContents{URI: r.Params.URI, Text: "file"}}, nil
		})
	s.AddPrompt(mcp.NewPrompt("get_summary", mcp.WithArgument("topic")), func(context.Context, mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
		return mcp.NewGetPromptResult("summary", []mcp.PromptMessage{mcp.NewPromptMessage(mcp.RoleUser, mcp.NewTextContent("sum up"))}), nil
	})
	ts := httptest.NewServer(server.NewStreamableHTTPServer(s, server.WithStateful(true)))
	t.Cleanup(ts.Close)
	return ts.URL + "/mcp"
}

type callPath struct {
	mcp, proxy, admin, auditDir string
}

func startCallPath(t *testing.T) *callPath {
	dir := t.TempDir()
	cp := &callPath{mcp: freeAddr(t), proxy: freeAddr(t), admin: freeAddr(t), auditDir: filepath.Join(dir, "audit")}
	writeFile(t, dir, "anthropic", "sk-ant-callpath-secret")
	cfg := writeFile(t, dir, "sandgate.yaml", fmt.Sprintf(`listen: {mcp: %q, proxy: %q, admin: %q, max_conns_per_source: 8}
policy: {dir: %q}
audit: {file: {dir: %q, fsync: never}}
shutdown: {delay: 0s}
credentials:
  - {name: anthropic, file: anthropic}
limits:
  templates:
    triage-agent: {requests_per_minute: 2}
gateway:
  max_sessions_per_sandbox: 3
  body_timeout: 2s
  min_body_rate: 1000000000
  upstreams:
    - {name: github, url: %q, prefix: never}
proxy:
  limits: {client_handshake_timeout: 500ms, body_timeout: 2s, min_body_rate: 1000000000}
  routes:
    - {name: anthropic, upstream: %q, api: anthropic, allow_private: true,
       credential: {name: anthropic, header: x-api-key}}
identity:
  static:
    - {addresses: [%q], namespace: agents, sandbox: coder-1, template: coding-agent}
    - {addresses: [%q], namespace: agents, sandbox: triage-1, template: triage-agent}
    - {addresses: [%q], namespace: agents, sandbox: marker-1, template: coding-agent}
log: {level: warn, format: text}
`, cp.mcp, cp.proxy, cp.admin, repoPath(t, "policies"), cp.auditDir, richUpstream(t), modelAPI(t), cpCoder, cpTriage, cpMarker))
	startServe(t, cfg, func(string) string { return "" })
	cp.waitReady(t)
	return cp
}

// waitReady waits for /readyz: every listener is up (the proxy's alone can be up before the
// MCP one) and every upstream was tried.
func (cp *callPath) waitReady(t *testing.T) {
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + cp.admin + "/readyz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	}, 30*time.Second, 20*time.Millisecond, "readyz")
}

// post sends one JSON-RPC body to /mcp from src.
func (cp *callPath) post(t *testing.T, src, sid, body string, hdr ...string) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+cp.mcp+"/mcp", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return send(t, src, req)
}

func send(t *testing.T, src string, req *http.Request) (int, string, http.Header) {
	t.Helper()
	code, body, h, err := trySendHeader(src, req)
	if code == 0 {
		require.NoError(t, err) // no answer at all; a body cut short is the caller's to judge
	}
	return code, body, h
}

// trySendHeader is send without failing the test: a cut answer is an error, not a failure.
func trySendHeader(src string, req *http.Request) (int, string, http.Header, error) {
	req.Close = true // one connection per request: the per-source cap counts open ones
	resp, err := fromAddr(src).Do(req)
	if err != nil {
		return 0, "", http.Header{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header, err
}

const initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`

// initialize sends initialize from src and returns the session ID.
func (cp *callPath) initialize(t *testing.T, src string) string {
	t.Helper()
	code, body, h := cp.post(t, src, "", initialize)
	require.Equal(t, http.StatusOK, code, body)
	sid := h.Get("Mcp-Session-Id")
	require.NotEmpty(t, sid)
	return sid
}

// session initializes an MCP session from src and returns its ID.
func (cp *callPath) session(t *testing.T, src string) string {
	t.Helper()
	sid := cp.initialize(t, src)
	code, _, _ := cp.post(t, src, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	require.Equal(t, http.StatusAccepted, code)
	return sid
}

func (cp *callPath) events(t *testing.T) []audit.Event {
	res, err := audit.Query(context.Background(), cp.auditDir, audit.Filter{Limit: -1})
	require.NoError(t, err)
	return res.Events
}

// eventsOf runs do and returns the events it caused. A marker request (a sandbox of its own on
// the proxy, a route that does not exist) before and after brackets them: the audit log is written in
// acceptance order, so what lies between the two markers' events is do's.
func (cp *callPath) eventsOf(t *testing.T, do func()) []audit.Event {
	t.Helper()
	cp.marker(t)
	before := len(cp.events(t))
	do()
	require.Eventually(t, func() bool { return len(cp.events(t)) > before }, 10*time.Second, 5*time.Millisecond, "no event")
	route := cp.marker(t)
	evs := cp.events(t)[before:]
	for i, ev := range evs {
		if ev.Target.Route == route {
			return evs[:i]
		}
	}
	t.Fatal("marker event missing")
	return nil
}

// marker sends one request whose event is recognisable and waits for the event.
func (cp *callPath) marker(t *testing.T) string {
	t.Helper()
	route := fmt.Sprintf("marker-%d", time.Now().UnixNano())
	req, _ := http.NewRequest(http.MethodGet, "http://"+cp.proxy+"/routes/"+route, nil)
	send(t, cpMarker, req)
	require.Eventually(t, func() bool {
		evs := cp.events(t)
		for i := len(evs) - 1; i >= 0; i-- {
			if evs[i].Target.Route == route {
				return true
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond, "marker event")
	return route
}

// TestEveryRequestIsOneEvent drives every kind of sandbox-facing request through the real
// listeners of "sandgate serve" and checks that each is exactly one audit event, of the right
// kind and code, with the revision that decided it, and that a refusal code answers with the
// same status on both halves.
func TestEveryRequestIsOneEvent(t *testing.T) {
	cp := startCallPath(t)
	var sid, triageSID string
	sessionRPC := func(src *string, s *string, body string, hdr ...string) func() {
		return func() { cp.post(t, *src, *s, body, hdr...) }
	}
	coder, triage := cpCoder, cpTriage
	route := func(src, body string) func() {
		return func() {
			req, _ := http.NewRequest(http.MethodPost, "http://"+cp.proxy+"/routes/anthropic/v1/messages", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			send(t, src, req)
		}
	}
	raw := func(addr, text string) func() {
		return func() {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(cpCoder)}}
			c, err := d.Dial("tcp", addr)
			require.NoError(t, err)
			defer c.Close()
			_, _ = io.WriteString(c, text)
			// Until the answer's first line, or until the server closes the connection.
			_, _ = bufio.NewReader(c).ReadString('\n')
		}
	}
	const haiku = `{"model":"claude-haiku-4-5","max_tokens":100,"messages":[]}`
	tests := []struct {
		name   string
		do     func()
		kind   audit.Kind
		code   string // outcome.error
		status int
		allow  bool
	}{
		{"initialize opens a session", func() { sid = cp.initialize(t, cpCoder) }, audit.KindInitialize, "", 200, true},
		{"notifications/initialized", sessionRPC(&coder, &sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`), audit.KindNotification, "", 202, true},
		{"initialize from an address that is no sandbox is refused before any session exists",
			sessionRPC(ptr(cpUnknown), ptr(""), initialize),
			audit.KindMCPRejected, "unknown_caller", 403, false},
		{"ping", sessionRPC(&coder, &sid, `{"jsonrpc":"2.0","id":2,"method":"ping"}`), audit.KindPing, "", 200, true},
		{"tools/list", sessionRPC(&coder, &sid, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`), audit.KindToolsList, "", 200, true},
		{"resources/list", sessionRPC(&coder, &sid, `{"jsonrpc":"2.0","id":4,"method":"resources/list"}`), audit.KindResourcesList, "", 200, true},
		{"resources/templates/list", sessionRPC(&coder, &sid, `{"jsonrpc":"2.0","id":5,"method":"resources/templates/list"}`), audit.KindTemplatesList, "", 200, true},
		{"prompts/list", sessionRPC(&coder, &sid, `{"jsonrpc":"2.0","id":6,"method":"prompts/list"}`), audit.KindPromptsList, "", 200, true},
		{"an allowed tools/call", sessionRPC(&coder, &sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"get_issue","arguments":{}}}`), audit.KindToolsCall, "", 200, true},
		{"a tools/call policy denies", sessionRPC(&coder, &sid, `{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"create_pull_request","arguments":{"owner":"acme","repo":"api"}}}`), audit.KindToolsCall, "repo_not_granted", 403, false},
		{"a tools/call of a tool that does not exist", sessionRPC(&coder, &sid, `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"nope","arguments":{}}}`), audit.KindToolsCall, "not_found", 404, false},
		{"an allowed resources/read", sessionRPC(&coder, &sid, `{"jsonrpc":"2.0","id":10,"method":"resources/read","params":{"uri":"get_docs://readme"}}`), audit.KindResourcesRead, "", 200, true},
		{"a hidden resources/read", sessionRPC(&coder, &sid, `{"jsonrpc":"2.0","id":11,"method":"resources/read","params":{"uri":"secret://keys"}}`), audit.KindResourcesRead, "tool_not_allowed", 404, false},
		{"a resources/read of a resource that does not exist", sessionRPC(&coder, &sid, `{"jsonrpc":"2.0","id":12,"method":"resources/read","params":{"uri":"nope://x"}}`), audit.KindResourcesRead, "not_found", 404, false},
		{"an allowed prompts/get", sessionRPC(&coder, &sid, `{"jsonrpc":"2.0","id":13,"method":"prompts/get","params":{"name":"get_summary","arguments":{"topic":"x"}}}`), audit.KindPromptsGet, "", 200, true},
		{"completion/complete reaches the upstream", sessionRPC(&coder, &sid, `{"jsonrpc":"2.0","id":14,"method":"completion/complete","params":{"ref":{"type":"ref/prompt","name":"get_summary"},"argument":{"name":"topic","value":"x"}}}`), audit.KindComplete, "", 0, true},
		{"resources/subscribe", sessionRPC(&coder, &sid, `{"jsonrpc":"2.0","id":15,"method":"resources/subscribe","params":{"uri":"get_docs://readme"}}`), audit.KindSubscribe, "", 200, true},
		{"logging/setLevel", sessionRPC(&coder, &sid, `{"jsonrpc":"2.0","id":16,"method":"logging/setLevel","params":{"level":"info"}}`), audit.KindSetLevel, "", 200, true},
		{"a batch is refused", sessionRPC(&coder, &sid, `[{"jsonrpc":"2.0","id":17,"method":"ping"}]`), audit.KindMCPRequest, "batch_refused", 400, false},
		{"a body that is not JSON-RPC is refused", sessionRPC(&coder, &sid, `{"jsonrpc":`), audit.KindMCPRequest, "malformed_request", 400, false},
		{"a foreign Origin is refused", sessionRPC(&coder, &sid, `{"jsonrpc":"2.0","id":18,"method":"ping"}`, "Origin", "https://evil.example"), audit.KindMCPRejected, "bad_origin", 403, false},
		{"a foreign Host is refused", func() {
			req, _ := http.NewRequest(http.MethodPost, "http://"+cp.mcp+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":19,"method":"ping"}`))
			req.Host = "evil.example"
			req.Header.Set("Content-Type", "application/json")
			send(t, cpCoder, req)
		}, audit.KindMCPRejected, "bad_host", 403, false},
		{"a body of another media type is refused", sessionRPC(&coder, &sid, `{}`, "Content-Type", "text/plain"), audit.KindMCPRequest, "unsupported_media_type", 415, false},
		{"a body over max_body_bytes is refused", sessionRPC(&coder, &sid, `{"x":"`+strings.Repeat("a", 5<<20)+`"}`), audit.KindMCPRequest, "body_too_large", 413, false},
		{"a request without a session is refused", sessionRPC(&coder, ptr(""), `{"jsonrpc":"2.0","id":20,"method":"ping"}`), audit.KindPing, "session_required", 400, false},
		{"a session used from another address is a hijack attempt", sessionRPC(&triage, &sid, `{"jsonrpc":"2.0","id":21,"method":"ping"}`), audit.KindPing, "session_not_owned", 404, false},
		{"a triage session", func() { triageSID = cp.initialize(t, cpTriage) }, audit.KindInitialize, "", 200, true},
		{"triage's first call", sessionRPC(&triage, &triageSID, `{"jsonrpc":"2.0","id":22,"method":"tools/call","params":{"name":"get_issue","arguments":{}}}`), audit.KindToolsCall, "", 200, true},
		{"triage's second call", route(cpTriage, haiku), audit.KindHTTPRequest, "", 200, true},
		{"a call over the rate limit on MCP", sessionRPC(&triage, &triageSID, `{"jsonrpc":"2.0","id":23,"method":"tools/call","params":{"name":"get_issue","arguments":{}}}`), audit.KindToolsCall, "rate_limited", 429, false},
		{"a request over the rate limit on the proxy: the same status", route(cpTriage, haiku), audit.KindHTTPRequest, "rate_limited", 429, false},
		{"DELETE ends a session", func() {
			req, _ := http.NewRequest(http.MethodDelete, "http://"+cp.mcp+"/mcp", nil)
			req.Header.Set("Mcp-Session-Id", triageSID)
			send(t, cpTriage, req)
		}, audit.KindSessionEnd, "", 200, true},
		{"an allowed model request on the route", route(cpCoder, haiku), audit.KindHTTPRequest, "", 200, true},
		{"a model policy denies on the route", route(cpCoder, `{"model":"claude-opus-4","max_tokens":100,"messages":[]}`), audit.KindHTTPRequest, "model_not_allowed", 403, false},
		{"an unknown route", func() {
			req, _ := http.NewRequest(http.MethodGet, "http://"+cp.proxy+"/routes/nope/x", nil)
			send(t, cpCoder, req)
		}, audit.KindHTTPRequest, "no_route", 404, false},
		{"a proxy request from an address that is no sandbox is refused before policy, as on the gateway", route(cpUnknown, haiku), audit.KindHTTPRejected, "unknown_caller", 403, false},
		{"a CONNECT to a host that is not configured", raw(cp.proxy, "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"), audit.KindHTTPConnect, "", 403, false},
		{"a request with both Content-Length and Transfer-Encoding", raw(cp.proxy, "POST /routes/anthropic/v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), audit.KindHTTPRejected, "request_smuggling", 400, false},
		{"a conflicting Content-Length that net/http refuses itself", raw(cp.proxy, "POST /routes/anthropic/v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"), audit.KindHTTPRejected, "malformed_request", 400, false},
		{"a malformed Transfer-Encoding that net/http refuses itself", raw(cp.proxy, "POST /routes/anthropic/v1/messages HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n"), audit.KindHTTPRejected, "malformed_request", 400, false},
		{"a header line without a colon", raw(cp.proxy, "GET /routes/anthropic/v1/models HTTP/1.1\r\nHost: x\r\nContent-Length\r\n\r\n"), audit.KindHTTPRejected, "malformed_request", 400, false},
		{"an HTTP/0.9 request", raw(cp.proxy, "GET /\r\n\r\n"), audit.KindHTTPRejected, "malformed_request", 400, false},
		{"a CONNECT with a malformed authority", raw(cp.proxy, "CONNECT /x HTTP/1.1\r\nHost: x\r\n\r\n"), "", "", 0, false},
		{"a head that never completes is cut at the header timeout", raw(cp.proxy, "GET /routes/anthropic/v1/models HTTP/1.1\r\nHost: x\r\n"), audit.KindHTTPRejected, "header_timeout", 408, false},
		{"an MCP body trickled slower than the body timeout is cut", raw(cp.mcp, "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"), audit.KindMCPRequest, "body_timeout", 408, false},
		{"a route body trickled slower than the body timeout is cut", raw(cp.proxy, "POST /routes/anthropic/v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"), audit.KindHTTPRequest, "body_timeout", 408, false},
		{"the admin listener refuses a sandbox", func() {
			req, _ := http.NewRequest(http.MethodGet, "http://"+cp.admin+"/metrics", nil)
			send(t, cpCoder, req)
		}, audit.KindHTTPRejected, "admin_from_sandbox", 403, false},
		{"a connection over the per-source cap is closed", func() {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.77")}} // a source nothing else uses
			var conns []net.Conn
			for range 9 {
				c, err := d.Dial("tcp", cp.proxy)
				require.NoError(t, err)
				conns = append(conns, c)
			}
			// The ninth is closed by Sandgate: its read ends without an answer.
			_, err := conns[8].Read(make([]byte, 1))
			assert.Error(t, err)
			for _, c := range conns {
				c.Close()
			}
		}, audit.KindHTTPRejected, "too_many_connections", 429, false},
		{"OPTIONS * reaches Sandgate's handler", raw(cp.proxy, "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n"), audit.KindHTTPRequest, "no_route", 404, false},
		// The MCP listener reads heads with the proxy's loop (internal/httpconn): what it refuses is
		// answered by Sandgate and audited once, as mcp.rejected.
		{"a header line without a colon, to the MCP listener", raw(cp.mcp, "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length\r\n\r\n"), audit.KindMCPRejected, "malformed_request", 400, false},
		{"an HTTP/0.9 request to the MCP listener", raw(cp.mcp, "GET /\r\n\r\n"), audit.KindMCPRejected, "malformed_request", 400, false},
		{"a conflicting Content-Length to the MCP listener", raw(cp.mcp, "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"), audit.KindMCPRejected, "malformed_request", 400, false},
		{"both Content-Length and Transfer-Encoding to the MCP listener", raw(cp.mcp, "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), audit.KindMCPRejected, "request_smuggling", 400, false},
		{"a path other than /mcp", raw(cp.mcp, "GET /admin HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"), audit.KindMCPRejected, "not_found", 404, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			evs := cp.eventsOf(t, tt.do)
			require.Len(t, evs, 1, "exactly one event: %+v", evs)
			ev := evs[0]
			if tt.kind != "" {
				assert.Equal(t, tt.kind, ev.Kind)
			}
			if tt.code != "" {
				assert.Equal(t, tt.code, ev.Outcome.Error)
			}
			if tt.status != 0 {
				assert.Equal(t, tt.status, ev.Outcome.Status)
			}
			assert.Equal(t, tt.allow, ev.Decision.Allow)
			assert.NotEmpty(t, ev.Decision.PolicyRevision, "every event names a policy revision")
			assert.NotContains(t, fmt.Sprint(ev), "sk-ant-callpath-secret")
		})
	}

	t.Run("a hidden resource and a missing one get byte-identical answers", func(t *testing.T) {
		_, hidden, _ := cp.post(t, cpCoder, sid, `{"jsonrpc":"2.0","id":30,"method":"resources/read","params":{"uri":"secret://keys"}}`)
		_, missing, _ := cp.post(t, cpCoder, sid, `{"jsonrpc":"2.0","id":30,"method":"resources/read","params":{"uri":"secret://keyz"}}`)
		assert.Equal(t, strings.Replace(hidden, "secret://keys", "URI", 1), strings.Replace(missing, "secret://keyz", "URI", 1))
	})

	t.Run("a head the MCP listener refuses is answered with a JSON-RPC error", func(t *testing.T) {
		c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(cpCoder)}}).Dial("tcp", cp.mcp)
		require.NoError(t, err)
		defer c.Close()
		_, err = io.WriteString(c, "GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Name: x\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
		assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
		assert.JSONEq(t, `{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"malformed request head: invalid header name","data":{"code":"malformed_request"}}}`, string(b))
	})

	t.Run("sessions are capped per sandbox", func(t *testing.T) {
		cp.session(t, cpCoder)
		cp.session(t, cpCoder)
		evs := cp.eventsOf(t, sessionRPC(&coder, ptr(""), initialize))
		require.Len(t, evs, 1)
		assert.Equal(t, "session_limit", evs[0].Outcome.Error)
		assert.Equal(t, 429, evs[0].Outcome.Status)
	})
}

func ptr(s string) *string { return &s }
