package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
)

// cpBudget is the source of budget-1, a sandbox whose template has a token budget of 10 a day.
const cpBudget = "127.0.0.61"

// parityPolicy allows every call of budget-1, every call of coder-1 naming a credential no destination is configured
// with, and fails to evaluate the calls of triage-1: two rules give decision different values
// (OPA's eval_conflict_error at evaluation time, not at load). It lets triage-1 see its tools:
// the gateway asks policy whether a tool is visible before the call is decided, and a tool
// hidden by an error answers "not found" like a missing one (never "allowed").
const parityPolicy = `package sandgate

default decision := {"allow": false, "reason": "denied by default", "code": "default_deny"}

decision := {"allow": true, "reason": "allowed, with a credential of elsewhere", "credential": "elsewhere"} if {
	input.identity.sandbox == "coder-1"
}

decision := {"allow": true, "reason": "allowed", "credential": "anthropic"} if {
	input.identity.sandbox == "budget-1"
}

decision := {"allow": true, "reason": "listed"} if {
	input.identity.sandbox == "triage-1"
	input.kind == "mcp.tools_list"
}

decision := {"allow": true, "reason": "one answer"} if {
	input.identity.sandbox == "triage-1"
	input.kind != "mcp.tools_list"
}

decision := {"allow": false, "reason": "another answer", "code": "other"} if {
	input.identity.sandbox == "triage-1"
	input.kind != "mcp.tools_list"
}
`

// startParityPolicy starts `sandgate serve` as startParity does, with parityPolicy, one MCP
// session and one tunnel per sandbox, a tunnel host (hold) that accepts and holds, and the
// model route to a model that reports 50 tokens of usage for every answer.
func startParityPolicy(t *testing.T, hold string) *callPath {
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-haiku-4-5","content":[],"usage":{"input_tokens":20,"output_tokens":30}}`)
	}))
	t.Cleanup(model.Close)
	dir := t.TempDir()
	cp := &callPath{mcp: freeAddr(t), proxy: freeAddr(t), admin: freeAddr(t), auditDir: filepath.Join(dir, "audit")}
	writeFile(t, dir, "anthropic", "sk-ant-parity-secret")
	policies := filepath.Join(dir, "policies")
	require.NoError(t, os.Mkdir(policies, 0o755))
	writeFile(t, policies, "sandgate.rego", parityPolicy)
	cfg := writeFile(t, dir, "sandgate.yaml", fmt.Sprintf(`listen: {mcp: %q, proxy: %q, admin: %q}
policy: {dir: %q}
audit: {file: {dir: %q, fsync: never}}
credentials:
  - {name: anthropic, file: anthropic}
limits:
  templates:
    budget-agent: {tokens_per_day: 10}
gateway:
  max_sessions_per_sandbox: 1
  upstreams:
    - {name: github, url: %q, prefix: never}
proxy:
  limits: {tunnels_per_sandbox: 1}
  hosts:
    - {host: 127.0.0.1, port: %d, mode: tunnel, allow_private: true}
  routes:
    - {name: anthropic, upstream: "http://%s", api: anthropic, allow_private: true,
       credential: {name: anthropic, header: x-api-key}}
identity:
  static:
    - {addresses: [%q], namespace: agents, sandbox: coder-1, template: coding-agent}
    - {addresses: [%q], namespace: agents, sandbox: triage-1, template: triage-agent}
    - {addresses: [%q], namespace: agents, sandbox: marker-1, template: coding-agent}
    - {addresses: [%q], namespace: agents, sandbox: budget-1, template: budget-agent}
shutdown: {delay: 0s}
log: {level: warn, format: text}
`, cp.mcp, cp.proxy, cp.admin, policies, cp.auditDir, richUpstream(t), holdPort(t, hold), strings.TrimPrefix(model.URL, "http://"), cpCoder, cpTriage, cpMarker, cpBudget))
	startServe(t, cfg, func(string) string { return "" })
	cp.waitReady(t)
	return cp
}

// The scenarios of TestBothHalvesAnswerAlike that need a policy of their own: a policy that
// names a credential the destination is not configured with, and one that fails to evaluate.
// Both are refused by the one step both halves share (call.TakeCredential, call.Authorize)
// with the same code and status.
func TestBothHalvesAnswerAlikeOnPolicy(t *testing.T) {
	const haiku = `{"model":"claude-haiku-4-5","max_tokens":100,"messages":[]}`
	hold := holdingListener(t)
	cp := startParityPolicy(t, hold)
	coderSID, triageSID := cp.session(t, cpCoder), cp.session(t, cpTriage)
	open := connectFrom(t, cp, cpCoder, hold) // coder-1's one tunnel, open to the end
	require.Equal(t, http.StatusOK, open.status)
	budgetSID := cp.session(t, cpBudget)
	spend := cp.eventsOf(t, func() { parityRoute(t, cp, cpBudget, haiku)() }) // 50 tokens of a budget of 10
	require.Len(t, spend, 1)
	require.Equal(t, 50, int(spend[0].Outcome.TokensIn+spend[0].Outcome.TokensOut), "%+v", spend[0])
	toolCall := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"get_issue","arguments":{}}}`
	kinds := [2]audit.Kind{audit.KindToolsCall, audit.KindHTTPRequest}
	runParity(t, cp, []parityScenario{
		{name: "credential not configured", gateway: parityPost(t, cp, cpCoder, coderSID, toolCall), proxy: parityRoute(t, cp, cpCoder, haiku),
			code: "credential_not_configured", kinds: kinds, status: 403},
		{name: "policy error", gateway: parityPost(t, cp, cpTriage, triageSID, toolCall), proxy: parityRoute(t, cp, cpTriage, haiku),
			code: "policy_error", kinds: kinds, status: 403},
		{name: "budget spent", gateway: parityPost(t, cp, cpBudget, budgetSID, toolCall), proxy: parityRoute(t, cp, cpBudget, haiku),
			code: "token_budget_spent", kinds: kinds, status: 429, retryAfter: true},
		// The gateway's cap counts sessions, the proxy's tunnels: each is the long-lived thing
		// a sandbox holds open on its half.
		{name: "session or tunnel cap", gateway: parityPost(t, cp, cpCoder, "", initialize),
			proxy: func() reply { a := connectFrom(t, cp, cpCoder, hold); return reply{a.status, a.header, a.body} },
			codes: [2]string{"session_limit", "too_many_tunnels"}, kinds: [2]audit.Kind{audit.KindInitialize, audit.KindHTTPConnect},
			status: 429, sameHTTPClass: true},
	})
}

// holdingListener is a loopback address that accepts connections and holds them open.
func holdingListener(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
		}
	}()
	return ln.Addr().String()
}

func holdPort(t *testing.T, addr string) int {
	_, p, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	n, err := strconv.Atoi(p)
	require.NoError(t, err)
	return n
}

// connectFrom sends CONNECT dest from src to the proxy; an established tunnel stays open until
// the test ends.
func connectFrom(t *testing.T, cp *callPath, src, dest string) answer {
	c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}).Dial("tcp", cp.proxy)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = io.WriteString(c, "CONNECT "+dest+" HTTP/1.1\r\nHost: "+dest+"\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	a := answer{status: resp.StatusCode, header: resp.Header}
	if resp.StatusCode != http.StatusOK { // a refusal has a body; an open tunnel does not end
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		a.body = string(b)
	}
	return a
}
