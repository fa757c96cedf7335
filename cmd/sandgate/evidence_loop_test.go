package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/suggest"
	"github.com/sandgate/sandgate/policy"
)

// evidenceExample is the example config as `make run` serves it, in a copy: the shipped
// policies copied (the test edits them) with triage-agent in report-only mode, the real
// examples/mcp-upstream, the CA and audit keys, free ports, and proxy.golang.org's tunnel
// dialed at a local echo listener (proxy.connect_to), so that a tunnel is a loopback one.
type evidenceExample struct {
	root, cfg, policies string
	mcp, proxy, admin   string
}

func startEvidenceExample(t *testing.T) *evidenceExample {
	t.Helper()
	root := t.TempDir()
	x := &evidenceExample{root: root, policies: filepath.Join(root, "policies"), mcp: freeAddr(t), proxy: freeAddr(t), admin: freeAddr(t)}
	require.NoError(t, os.Rename(copyPolicies(t), x.policies))
	data, err := os.ReadFile(filepath.Join(x.policies, "data.yaml"))
	require.NoError(t, err)
	observed := strings.Replace(string(data), "  triage-agent:\n", "  triage-agent:\n    enforce: false\n", 1)
	require.NotEqual(t, string(data), observed)
	writeFile(t, x.policies, "data.yaml", observed)

	for _, d := range []string{"examples", "bin", "var/secrets"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	require.NoError(t, os.Rename(buildExampleUpstream(t), filepath.Join(root, "bin", "mcp-upstream")))
	writeFile(t, filepath.Join(root, "var", "secrets"), "anthropic", "sk-ant-placeholder")
	code, _, errOut := runCLI(t, nil, "ca", "init", "--dir", filepath.Join(root, "var", "ca"))
	require.Equal(t, 0, code, errOut)
	code, _, errOut = runCLI(t, nil, "audit", "keygen", "--dir", filepath.Join(root, "var", "audit-keys"))
	require.Equal(t, 0, code, errOut)

	example, err := os.ReadFile(repoPath(t, "examples/sandgate.yaml"))
	require.NoError(t, err)
	cfg := string(example)
	for from, to := range map[string]string{"127.0.0.1:8080": x.mcp, "127.0.0.1:3128": x.proxy, "127.0.0.1:9090": x.admin,
		`connect_to: {"api.anthropic.com:443": "127.0.0.1:8443"}`: fmt.Sprintf(`connect_to: {"api.anthropic.com:443": "127.0.0.1:8443", "proxy.golang.org:443": %q, "registry.npmjs.org:443": %q}`,
			echoListener(t), echoListener(t)),
		"level: info": "level: warn"} {
		require.Contains(t, cfg, from)
		cfg = strings.ReplaceAll(cfg, from, to)
	}
	require.Contains(t, cfg, "decision_log:", "the example config logs decisions")
	x.cfg = writeFile(t, filepath.Join(root, "examples"), "sandgate.yaml", cfg+"shutdown: {delay: 0s}\n")
	startServe(t, x.cfg, func(string) string { return "" })
	x.waitRevision(t)
	return x
}

// echoListener is a loopback TCP server that sends back what it reads.
func echoListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln.Addr().String()
}

// waitRevision waits until serve is ready with the revision of the policy folder as it is now.
func (x *evidenceExample) waitRevision(t *testing.T) {
	t.Helper()
	eng, err := policy.New(context.Background(), x.policies)
	require.NoError(t, err)
	want := eng.Revision()
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + x.admin + "/readyz")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var body struct {
			Revision string `json:"policy_revision"`
		}
		return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&body) == nil && body.Revision == want
	}, 60*time.Second, 20*time.Millisecond, "serve ready with revision %s", want)
}

// callTool calls a tool from src in a new session and returns the response body.
func (x *evidenceExample) callTool(t *testing.T, src, tool, args string) string {
	t.Helper()
	cp := &callPath{mcp: x.mcp}
	sid := cp.session(t, src)
	code, body, _ := cp.post(t, src, sid, fmt.Sprintf(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":%q,"arguments":%s}}`, tool, args))
	require.Equal(t, http.StatusOK, code, body)
	return body
}

func (x *evidenceExample) listTools(t *testing.T, src string) string {
	t.Helper()
	cp := &callPath{mcp: x.mcp}
	sid := cp.session(t, src)
	code, body, _ := cp.post(t, src, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	require.Equal(t, http.StatusOK, code, body)
	return body
}

// connect opens a tunnel from src through the proxy and says whether bytes go through it.
func (x *evidenceExample) connect(t *testing.T, src, target string) (int, bool) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", x.proxy)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(20*time.Second)))
	fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, false
	}
	fmt.Fprint(c, "ping\n")
	line, err := br.ReadString('\n')
	return resp.StatusCode, err == nil && line == "ping\n"
}

func (x *evidenceExample) events(t *testing.T) []audit.Event {
	t.Helper()
	res, err := audit.Query(context.Background(), filepath.Join(x.root, "var", "audit"), audit.Filter{Limit: -1})
	require.NoError(t, err)
	return res.Events
}

// eventOf waits for the newest event of kind whose target is target (tool or host).
func (x *evidenceExample) eventOf(t *testing.T, kind audit.Kind, target string, after time.Time) audit.Event {
	t.Helper()
	var found audit.Event
	require.Eventually(t, func() bool {
		for _, ev := range x.events(t) {
			if ev.Kind == kind && (ev.Target.Tool == target || ev.Target.Host == target) && !ev.Time.Before(after) {
				found = ev
			}
		}
		return found.ID != ""
	}, 10*time.Second, 20*time.Millisecond, "an event of %s %s", kind, target)
	return found
}

// The loop docs/policies.md walks, on the example config: a template in report-only mode is
// denied a tool and a host, which are let through and recorded; `policy suggest` proposes
// exactly those two entries and the removal of what the template never used; the real `opa
// test` passes on the suggested folder; `policy replay` of it shows exactly those two flips;
// shipped and enforced, the calls are allowed and the rest is enforced.
func TestPolicyFromEvidenceLoop(t *testing.T) {
	x := startEvidenceExample(t)
	start := time.Now().Add(-time.Second)

	// Observe: triage-agent in report-only mode sees add and calls it, and opens a tunnel to a
	// host it may not reach. Both go through; echo, which it may use, is used.
	assert.Contains(t, x.listTools(t, cpTriage), `"name":"add"`, "report-only: what its calls would be let through with is listed")
	assert.Contains(t, x.callTool(t, cpTriage, "add", `{"a":2,"b":3}`), `"text":"5"`)
	assert.Contains(t, x.callTool(t, cpTriage, "echo", `{"message":"hi"}`), `"text":"hi"`)
	status, through := x.connect(t, cpTriage, "proxy.golang.org:443")
	require.Equal(t, http.StatusOK, status)
	require.True(t, through, "the tunnel carries bytes")

	add := x.eventOf(t, audit.KindToolsCall, "add", start)
	assert.True(t, add.Decision.Allow)
	assert.Equal(t, "tool_not_allowed", add.Decision.WouldDeny)
	conn := x.eventOf(t, audit.KindHTTPConnect, "proxy.golang.org", start)
	assert.True(t, conn.Decision.Allow)
	assert.Equal(t, "host_not_allowed", conn.Decision.WouldDeny)
	code, out, _ := runCLI(t, nil, "audit", "query", "--config", x.cfg, "--sandbox", "agents/triage-1", "--decision", "report")
	require.Equal(t, 0, code)
	assert.Contains(t, out, "allow (report: tool_not_allowed)")
	assert.Contains(t, out, "allow (report: host_not_allowed)")
	metrics := adminGet(t, x.admin, "/metrics")
	assert.Regexp(t, regexp.MustCompile(`sandgate_policy_report_only_total\{[^}]*code="host_not_allowed"[^}]*kind="http.connect"[^}]*\} 1`), metrics)
	assert.Regexp(t, regexp.MustCompile(`sandgate_policy_report_only_total\{[^}]*code="tool_not_allowed"[^}]*kind="mcp.tools_call"[^}]*\} 1`), metrics)

	// Suggest: exactly the two entries, and the removal of what triage-agent never used.
	next := filepath.Join(x.root, "policies-next")
	var s suggest.Suggestion
	require.Eventually(t, func() bool { // the decision log is written off the request path
		code, out, errOut := runCLI(t, nil, "policy", "suggest", "--template", "triage-agent", "--config", x.cfg, "-o", "json")
		require.Equal(t, 0, code, errOut)
		require.NoError(t, json.Unmarshal([]byte(out), &s))
		return len(s.Add) == 2
	}, 10*time.Second, 50*time.Millisecond)
	code, out, errOut := runCLI(t, nil, "policy", "suggest", "--template", "triage-agent", "--config", x.cfg, "--out", next, "-o", "json")
	require.Equal(t, 0, code, errOut)
	require.NoError(t, json.Unmarshal([]byte(out), &s))
	assert.Equal(t, []string{"tools everything/add", "hosts proxy.golang.org"}, entryNames(s.Add))
	assert.Equal(t, []string{"tools github/get_issue", "tools github/list_issues", "tools github/search_issues",
		"models anthropic/claude-haiku-4-5"}, entryNames(s.Remove))
	assert.Equal(t, add.ID, s.Add[0].Evidence.Example, "the evidence names the call")
	assert.Equal(t, conn.ID, s.Add[1].Evidence.Example)
	assert.Equal(t, 1, s.Add[0].Evidence.Count)

	// Test: the real opa runs the suggested folder's tests, the generated ones among them.
	opa := repoPath(t, ".tools/bin/opa")
	if _, err := os.Stat(opa); err != nil {
		t.Fatalf("%s is missing: run test/setup.sh", opa)
	}
	b, err := exec.Command(opa, "test", "-v", next).CombinedOutput()
	require.NoError(t, err, "opa test %s:\n%s", next, b)
	assert.Contains(t, string(b), "test_allows_tools_everything_add: PASS")
	assert.Contains(t, string(b), "test_allows_hosts_proxy_golang_org: PASS")
	assert.Contains(t, string(b), "test_denies_tools_github_get_issue: PASS")

	// Replay: exactly those two flips.
	code, out, errOut = runCLI(t, nil, "policy", "replay", "--policies", next, "--config", x.cfg, "-o", "json")
	require.Equal(t, 0, code, errOut)
	var r policy.ReplayReport
	require.NoError(t, json.Unmarshal([]byte(out), &r))
	assert.Equal(t, policy.SourceDecisionLog, r.Source)
	assert.Equal(t, 0, r.AllowToDeny)
	assert.Equal(t, 0, r.CodeChanged)
	assert.Equal(t, []policy.ReplayChange{
		{Direction: policy.DenyToAllow, Kind: "http.connect", Template: "triage-agent", FromCode: "host_not_allowed", ToCode: "host_allowed",
			Count: 1, Targets: []policy.ReplayTarget{{Target: "CONNECT proxy.golang.org", Count: 1}}},
		{Direction: policy.DenyToAllow, Kind: "mcp.tools_call", Template: "triage-agent", FromCode: "tool_not_allowed", ToCode: "tool_allowed",
			Count: 1, Targets: []policy.ReplayTarget{{Target: "everything/add", Count: 1}}},
	}, r.Changes)

	// Pin the upstream's tools in the candidate.
	code, out, errOut = runCLI(t, nil, "policy", "pin", "--config", x.cfg, "--policies", next)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "pinned 4 tools of 1 upstream")

	// Ship, enforced: the candidate replaces the serving folder without enforce: false.
	shipped := filepath.Join(x.root, "policies-shipped")
	require.NoError(t, os.Rename(next, shipped))
	d, err := os.ReadFile(filepath.Join(shipped, "data.yaml"))
	require.NoError(t, err)
	writeFile(t, shipped, "data.yaml", strings.Replace(string(d), "    enforce: false\n", "", 1))
	old := x.policies + ".old"
	require.NoError(t, os.Rename(x.policies, old))
	require.NoError(t, os.Rename(shipped, x.policies))
	x.waitRevision(t)
	shippedAt := time.Now()

	assert.Contains(t, x.callTool(t, cpTriage, "add", `{"a":2,"b":3}`), `"text":"5"`)
	status, through = x.connect(t, cpTriage, "proxy.golang.org:443")
	assert.Equal(t, http.StatusOK, status)
	assert.True(t, through)
	addNow := x.eventOf(t, audit.KindToolsCall, "add", shippedAt)
	assert.True(t, addNow.Decision.Allow)
	assert.Empty(t, addNow.Decision.WouldDeny, "allowed by the policy now, not let through")
	connNow := x.eventOf(t, audit.KindHTTPConnect, "proxy.golang.org", shippedAt)
	assert.True(t, connNow.Decision.Allow)
	assert.Empty(t, connNow.Decision.WouldDeny)
	status, _ = x.connect(t, cpTriage, "registry.npmjs.org:443")
	assert.Equal(t, http.StatusForbidden, status, "what the template may not reach is enforced now")
	denied := x.eventOf(t, audit.KindHTTPConnect, "registry.npmjs.org", shippedAt)
	assert.False(t, denied.Decision.Allow)
	assert.Empty(t, denied.Decision.WouldDeny)
	code, out, _ = runCLI(t, nil, "policy", "pin", "--config", x.cfg, "--diff")
	assert.Equal(t, 0, code, out)

	t.Run("a hidden tool's call is on record and replays as the new tool", func(t *testing.T) {
		before := time.Now()
		body := x.callTool(t, cpTriage, "get-time", `{}`)
		assert.NotContains(t, body, "denied by Sandgate", "a hidden tool answers as a missing one")
		ev := x.eventOf(t, audit.KindToolsCall, "get-time", before)
		assert.False(t, ev.Decision.Allow)
		assert.Contains(t, ev.Decision.Reason, "not in the sandbox's list")
		data, err := os.ReadFile(filepath.Join(x.policies, "data.yaml"))
		require.NoError(t, err)
		withTool := filepath.Join(x.root, "policies-get-time")
		require.NoError(t, os.Rename(copyFolderForTest(t, x.policies), withTool))
		writeFile(t, withTool, "data.yaml", strings.Replace(string(data), `allow: ["echo", "add"]`, `allow: ["echo", "add", "get-time"]`, 1))
		code, out, errOut := runCLI(t, nil, "policy", "replay", "--policies", withTool, "--config", x.cfg, "--since", "1m", "-o", "json")
		require.Equal(t, 0, code, errOut)
		var r policy.ReplayReport
		require.NoError(t, json.Unmarshal([]byte(out), &r))
		var flipped []policy.ReplayTarget
		for _, c := range r.Changes {
			if c.Direction == policy.DenyToAllow && c.Kind == "mcp.tools_call" {
				flipped = append(flipped, c.Targets...)
			}
		}
		// The report-only add of a minute ago is in the window too (denied in the log).
		assert.Contains(t, flipped, policy.ReplayTarget{Target: "everything/get-time", Count: 1}, "the hidden call replays as the new tool")
	})
}

func entryNames(es []suggest.Entry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.String()
	}
	return out
}

func adminGet(t *testing.T, admin, path string) string {
	t.Helper()
	resp, err := http.Get("http://" + admin + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// copyFolderForTest copies a policy folder's files into a new temporary folder.
func copyFolderForTest(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	files, err := filepath.Glob(filepath.Join(src, "*"))
	require.NoError(t, err)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dst, filepath.Base(f)), b, 0o644))
	}
	return dst
}
