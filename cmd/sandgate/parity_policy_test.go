package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
)

// parityPolicy allows every call of coder-1 naming a credential no destination is configured
// with, and fails to evaluate the calls of triage-1: two rules give decision different values
// (OPA's eval_conflict_error at evaluation time, not at load). It lets triage-1 see its tools:
// the gateway asks policy whether a tool is visible before the call is decided, and a tool
// hidden by an error answers "not found" like a missing one (never "allowed").
const parityPolicy = `package sandgate

default decision := {"allow": false, "reason": "denied by default", "code": "default_deny"}

decision := {"allow": true, "reason": "allowed, with a credential of elsewhere", "credential": "elsewhere"} if {
	input.identity.sandbox == "coder-1"
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

// startParityPolicy starts `sandgate serve` as startParity does, with parityPolicy.
func startParityPolicy(t *testing.T) *callPath {
	down := closedAddr(t)
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
gateway:
  upstreams:
    - {name: github, url: %q, prefix: never}
proxy:
  routes:
    - {name: anthropic, upstream: "http://%s", api: anthropic, allow_private: true,
       credential: {name: anthropic, header: x-api-key}}
identity:
  static:
    - {addresses: [%q], namespace: agents, sandbox: coder-1, template: coding-agent}
    - {addresses: [%q], namespace: agents, sandbox: triage-1, template: triage-agent}
    - {addresses: [%q], namespace: agents, sandbox: marker-1, template: coding-agent}
log: {level: warn, format: text}
`, cp.mcp, cp.proxy, cp.admin, policies, cp.auditDir, richUpstream(t), down, cpCoder, cpTriage, cpMarker))
	startServe(t, cfg, func(string) string { return "" })
	cp.waitReady(t)
	return cp
}

// The scenarios of TestBothHalvesAnswerAlike that need a policy of their own: a policy that
// names a credential the destination is not configured with, and one that fails to evaluate.
// Both are refused by the one step both halves share (call.TakeCredential, call.Authorize)
// with the same code and status.
func TestBothHalvesAnswerAlikeOnPolicy(t *testing.T) {
	cp := startParityPolicy(t)
	coderSID, triageSID := cp.session(t, cpCoder), cp.session(t, cpTriage)
	const haiku = `{"model":"claude-haiku-4-5","max_tokens":100,"messages":[]}`
	toolCall := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"get_issue","arguments":{}}}`
	kinds := [2]audit.Kind{audit.KindToolsCall, audit.KindHTTPRequest}
	runParity(t, cp, []parityScenario{
		{name: "credential not configured", gateway: parityPost(t, cp, cpCoder, coderSID, toolCall), proxy: parityRoute(t, cp, cpCoder, haiku),
			code: "credential_not_configured", kinds: kinds, status: 403},
		{name: "policy error", gateway: parityPost(t, cp, cpTriage, triageSID, toolCall), proxy: parityRoute(t, cp, cpTriage, haiku),
			code: "policy_error", kinds: kinds, status: 403},
	})
}
