package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
)

// startParity starts `sandgate serve` for the parity test: a 1 MiB body bound on both halves,
// a triage template allowed one request a minute across them, and on each half an upstream
// nothing answers for: the MCP upstream "everything" (never seen, its tools under everything_)
// and the model route, both at a loopback port nothing listens on.
func startParity(t *testing.T) *callPath {
	down := closedAddr(t)
	dir := t.TempDir()
	cp := &callPath{mcp: freeAddr(t), proxy: freeAddr(t), admin: freeAddr(t), auditDir: filepath.Join(dir, "audit")}
	writeFile(t, dir, "anthropic", "sk-ant-parity-secret")
	cfg := writeFile(t, dir, "sandgate.yaml", fmt.Sprintf(`listen: {mcp: %q, proxy: %q, admin: %q}
policy: {dir: %q}
audit: {file: {dir: %q, fsync: never}}
credentials:
  - {name: anthropic, file: anthropic}
limits:
  templates:
    triage-agent: {requests_per_minute: 1}
gateway:
  max_body_bytes: 1048576
  upstreams:
    - {name: github, url: %q, prefix: never}
    - {name: everything, url: "http://%s/mcp", prefix: always}
proxy:
  limits: {body_bytes: 1048576}
  routes:
    - {name: anthropic, upstream: "http://%s", api: anthropic, allow_private: true,
       credential: {name: anthropic, header: x-api-key}}
identity:
  static:
    - {addresses: [%q], namespace: agents, sandbox: coder-1, template: coding-agent}
    - {addresses: [%q], namespace: agents, sandbox: triage-1, template: triage-agent}
    - {addresses: [%q], namespace: agents, sandbox: marker-1, template: coding-agent}
shutdown: {delay: 0s}
log: {level: warn, format: text}
`, cp.mcp, cp.proxy, cp.admin, repoPath(t, "policies"), cp.auditDir, richUpstream(t), down, down, cpCoder, cpTriage, cpMarker))
	startServe(t, cfg, func(string) string { return "" })
	cp.waitReady(t)
	return cp
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// answer is what one half answered a scenario with, and the scenario's one event.
type answer struct {
	status int
	header http.Header
	body   string
	ev     audit.Event
}

// reply is a half's HTTP answer to one scenario.
type reply struct {
	status int
	header http.Header
	body   string
}

// TestBothHalvesAnswerAlike runs one table of scenarios against the gateway and the proxy
// through the real listeners of `sandgate serve`: each refusal has the same code, event status,
// Retry-After and a reason on both halves, and the event kind each half's place in the path
// gives it. It replaces the rows of TestEveryRequestIsOneEvent that pinned the halves'
// differences (an unknown caller was unknown_identity, decided by policy, on the proxy).
func TestBothHalvesAnswerAlike(t *testing.T) {
	cp := startParity(t)
	triageSID, coderSID := cp.session(t, cpTriage), cp.session(t, cpCoder)
	post := func(src, sid, body string) func() reply { return parityPost(t, cp, src, sid, body) }
	route := func(src, body string) func() reply { return parityRoute(t, cp, src, body) }
	raw := func(addr, text string) func() reply {
		return func() reply {
			c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(cpCoder)}}).Dial("tcp", addr)
			require.NoError(t, err)
			defer c.Close()
			_, _ = io.WriteString(c, text)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			require.NoError(t, err)
			defer resp.Body.Close()
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			return reply{resp.StatusCode, resp.Header, string(b)}
		}
	}
	const haiku = `{"model":"claude-haiku-4-5","max_tokens":100,"messages":[]}`
	toolCall := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"get_issue","arguments":{}}}`
	downCall := `{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"everything_echo","arguments":{"message":"x"}}}`
	big := `{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"` + strings.Repeat("a", 2<<20) + `"}}`
	badHead := func(path string) string {
		return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length\r\n\r\n"
	}
	scenarios := []parityScenario{
		{name: "unknown caller", gateway: post(cpUnknown, "", initialize), proxy: route(cpUnknown, haiku),
			code: "unknown_caller", kinds: [2]audit.Kind{audit.KindMCPRejected, audit.KindHTTPRejected}, status: 403, sameHTTPClass: true},
		{name: "rate limited", gateway: post(cpTriage, triageSID, toolCall), proxy: route(cpTriage, haiku),
			code: "rate_limited", kinds: [2]audit.Kind{audit.KindToolsCall, audit.KindHTTPRequest}, status: 429, retryAfter: true, untilRefused: true},
		{name: "body too large", gateway: post(cpCoder, "", big), proxy: route(cpCoder, `{"x":"`+strings.Repeat("a", 2<<20)+`"}`),
			// A request whose body was not read is a request on both halves (the gateway's, of
			// a message it could not read: mcp.request), refused the same way by call.Run.
			code: "body_too_large", kinds: [2]audit.Kind{audit.KindMCPRequest, audit.KindHTTPRequest}, status: 413, sameHTTPClass: true},
		{name: "upstream down", gateway: post(cpCoder, coderSID, downCall), proxy: route(cpCoder, haiku),
			code: "upstream_unavailable", kinds: [2]audit.Kind{audit.KindToolsCall, audit.KindHTTPRequest}, status: 503, allowed: true},
		{name: "bad head", gateway: raw(cp.mcp, badHead("/mcp")), proxy: raw(cp.proxy, badHead("/routes/anthropic/v1/messages")),
			code: "malformed_request", kinds: [2]audit.Kind{audit.KindMCPRejected, audit.KindHTTPRejected}, status: 400, sameHTTPClass: true},
	}
	runParity(t, cp, scenarios)
}

// parityScenario is one row of the parity table: the same situation on each half.
type parityScenario struct {
	name          string
	gateway       func() reply
	proxy         func() reply
	code          string
	codes         [2]string     // the gateway's code and the proxy's, where they count different things (code "")
	kinds         [2]audit.Kind // the gateway's event kind, the proxy's
	status        int           // the event's, the same on both halves
	retryAfter    bool
	allowed       bool // policy allowed it: the failure is the upstream's
	untilRefused  bool // repeat (up to 3 times) until the code: a limit's window may turn once
	sameHTTPClass bool // the HTTP answers share a status class too (an MCP tool refusal is a result in a 200)
}

// parityPost posts one MCP message from src on session sid (none: "").
func parityPost(t *testing.T, cp *callPath, src, sid, body string) func() reply {
	return func() reply {
		code, b, h := cp.post(t, src, sid, body)
		return reply{code, h, b}
	}
}

// parityRoute posts a model request from src to the proxy's anthropic route.
func parityRoute(t *testing.T, cp *callPath, src, body string) func() reply {
	return func() reply {
		req, _ := http.NewRequest(http.MethodPost, "http://"+cp.proxy+"/routes/anthropic/v1/messages", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		code, b, h := send(t, src, req)
		return reply{code, h, b}
	}
}

// runParity runs each scenario on both halves and asserts they answer alike.
func runParity(t *testing.T, cp *callPath, scenarios []parityScenario) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			var got [2]answer
			for i, do := range []func() reply{sc.gateway, sc.proxy} {
				for try := 0; ; try++ {
					var a answer
					evs := cp.eventsOf(t, func() {
						r := do()
						a.status, a.header, a.body = r.status, r.header, r.body
					})
					require.Len(t, evs, 1, "exactly one event: %+v", evs)
					a.ev = evs[0]
					if !sc.untilRefused || a.ev.Outcome.Error == sc.code || try == 2 {
						got[i] = a
						break
					}
				}
			}
			for i, half := range []string{"gateway", "proxy"} {
				a := got[i]
				want := sc.code
				if want == "" {
					want = sc.codes[i]
				}
				assert.Equal(t, want, a.ev.Outcome.Error, half)
				assert.Equal(t, sc.kinds[i], a.ev.Kind, half)
				assert.Equal(t, sc.status, a.ev.Outcome.Status, half)
				assert.Equal(t, sc.allowed, a.ev.Decision.Allow, half)
				assert.NotEmpty(t, a.ev.Decision.Reason, half)
				assert.Equal(t, sc.retryAfter, a.header.Get("Retry-After") != "", "%s: Retry-After %q", half, a.header.Get("Retry-After"))
				if sc.sameHTTPClass {
					assert.Equal(t, sc.status, a.status, half)
				}
				assertErrorShape(t, half, a, want, sc.allowed)
			}
		})
	}
}

// assertErrorShape checks the body of a half's answer: the error of its protocol (a JSON-RPC
// error, an MCP tool result marked isError, a provider's error object) whose message carries the
// event's reason (the refusal's, for what policy or a limit refused) and, where the shape has a
// field for it (JSON-RPC error data, the provider error's code), the event's code.
func assertErrorShape(t *testing.T, half string, a answer, code string, allowed bool) {
	t.Helper()
	var msg struct {
		Error *struct {
			Message string `json:"message"`
			Code    any    `json:"code"`
			Data    *struct {
				Code string `json:"code"`
			} `json:"data"`
		} `json:"error"`
		Result *struct {
			IsError bool `json:"isError"`
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"result"`
	}
	body := a.body
	if i := strings.Index(body, "data: "); i >= 0 && strings.HasPrefix(a.header.Get("Content-Type"), "text/event-stream") {
		body, _, _ = strings.Cut(body[i+len("data: "):], "\n")
	}
	require.NoError(t, json.Unmarshal([]byte(body), &msg), "%s: the answer is JSON: %q", half, a.body)
	var text, gotCode string
	switch {
	case msg.Error != nil:
		text = msg.Error.Message
		if s, ok := msg.Error.Code.(string); ok { // the provider's error
			gotCode = s
		} else if msg.Error.Data != nil { // JSON-RPC
			gotCode = msg.Error.Data.Code
		}
		assert.Equal(t, code, gotCode, "%s: the error names the event's code: %s", half, a.body)
	case msg.Result != nil:
		require.True(t, msg.Result.IsError, "%s: a tool result that answers a refusal is an error: %s", half, a.body)
		require.NotEmpty(t, msg.Result.Content, half)
		text = msg.Result.Content[0].Text
	default:
		t.Fatalf("%s: neither an error nor a result: %s", half, a.body)
	}
	if !allowed {
		assert.Contains(t, text, a.ev.Decision.Reason, "%s: the message carries the event's reason", half)
	}
}
