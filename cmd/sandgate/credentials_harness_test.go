package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/credential"
	"github.com/sandgate/sandgate/internal/respguard"
)

// The sandboxes of the minted-credential tests: each its own run (static identity: no claims,
// so a run is its sandbox).
const (
	runA = "127.0.0.2"
	runB = "127.0.0.3"
	runC = "127.0.0.4"
	runD = "127.0.0.5"
	runE = "127.0.0.6"
)

// mintPolicy allows every known caller, except a call to a GitHub repository outside what the
// run's token reaches (input.credential): policy refuses it before the upstream could.
const mintPolicy = `package sandgate

import rego.v1

default decision := {"allow": false, "reason": "caller is not a known sandbox", "code": "unknown_caller"}

decision := {"allow": true, "reason": "allowed"} if {
	input.identity.known
	not outside_token
}

decision := {"allow": false, "reason": sprintf("repository %s is outside what the run's token reaches", [repo]), "code": "outside_token"} if {
	input.identity.known
	outside_token
}

repo := concat("/", array.slice(split(input.http.path, "/"), 2, 4))

outside_token if {
	input.credential.provider == "github_app"
	startswith(input.http.path, "/repos/")
	not repo in input.credential.repositories
}
`

// echoUpstream answers every request with the Authorization it got, in a header and in the
// body (what a careless or hostile upstream does), and keeps each value it got.
type echoUpstream struct {
	url string
	mu  sync.Mutex
	got []string
}

func startEcho(t *testing.T) *echoUpstream {
	e := &echoUpstream{}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		e.mu.Lock()
		e.got = append(e.got, auth)
		e.mu.Unlock()
		w.Header().Set("X-Echo", auth)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"you_sent": auth})
	}))
	t.Cleanup(ts.Close)
	e.url = ts.URL
	return e
}

// seen is every Authorization value the upstream got, in order.
func (e *echoUpstream) seen() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.got...)
}

func (e *echoUpstream) last() string {
	s := e.seen()
	if len(s) == 0 {
		return ""
	}
	return s[len(s)-1]
}

// echoMCP is an MCP server whose tool whoami answers with the Authorization its request had.
func echoMCP(t *testing.T) string {
	s := server.NewMCPServer("echo", "1", server.WithToolCapabilities(false))
	s.AddTool(mcp.NewTool("whoami"), func(_ context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("you sent " + r.Header.Get("Authorization")), nil
	})
	ts := httptest.NewServer(server.NewStreamableHTTPServer(s, server.WithStateful(true)))
	t.Cleanup(ts.Close)
	return ts.URL + "/mcp"
}

// mintServe is a Sandgate serving minted credentials: a proxy route "echo" and an MCP upstream
// "echo" with the credential named cred, more routes as the test says, five static sandboxes.
type mintServe struct {
	*callPath
	adminToken string
	echo       *echoUpstream
}

// mintConfig is what a minted-credential test's Sandgate serves.
type mintConfig struct {
	// credentials are YAML list items (two-space indented under credentials:), extra is
	// top-level YAML, cred the credential of the echo route and MCP upstream, routes more
	// proxy routes (flow mappings).
	credentials, extra, cred string
	routes                   []string
	// admin is the admin listener's address (default: a free one), for an IdP started first.
	admin string
	// identity is the YAML of how callers are identified (default: five static sandboxes).
	identity string
}

// startMintServe starts Sandgate as c says, with the echo route and upstream.
func startMintServe(t *testing.T, c mintConfig) *mintServe {
	dir := t.TempDir()
	policies := filepath.Join(dir, "policies")
	require.NoError(t, os.MkdirAll(policies, 0o755))
	writeFile(t, policies, "sandgate.rego", mintPolicy)
	if c.admin == "" {
		c.admin = freeAddr(t)
	}
	credentials, extra, cred, routes := c.credentials, c.extra, c.cred, c.routes
	m := &mintServe{callPath: &callPath{mcp: freeAddr(t), proxy: freeAddr(t), admin: c.admin, auditDir: filepath.Join(dir, "audit")},
		adminToken: "admin-token-of-the-mint-tests", echo: startEcho(t)}
	writeFile(t, dir, "admin-token", m.adminToken)
	route := func(r string) string { return "    - " + r + "\n" }
	rs := route(fmt.Sprintf("{name: echo, upstream: %q, allow_private: true, credential: {name: %s}}", m.echo.url, cred))
	for _, r := range routes {
		rs += route(r)
	}
	var ids strings.Builder
	ids.WriteString("identity:\n  static:\n")
	for i, a := range []string{runA, runB, runC, runD, runE} {
		fmt.Fprintf(&ids, "    - {addresses: [%q], namespace: agents, sandbox: run-%c, template: coding-agent}\n", a, 'a'+i)
	}
	if c.identity != "" {
		ids.Reset()
		ids.WriteString(c.identity + "\n")
	}
	cfg := writeFile(t, dir, "sandgate.yaml", fmt.Sprintf(`listen: {mcp: %q, proxy: %q, admin: %q}
policy: {dir: %q}
audit: {file: {dir: %q, fsync: never}}
shutdown: {delay: 0s}
admin: {token_credential: admin-token}
credentials:
  - {name: admin-token, file: admin-token}
%s
%s
gateway:
  upstreams:
    - {name: echo, url: %q, prefix: never, credential: {name: %s}}
proxy:
  routes:
%s%slog: {level: warn, format: text}
`, m.mcp, m.proxy, m.admin, policies, m.auditDir, credentials, extra, echoMCP(t), cred, rs, ids.String()))
	startServe(t, cfg, func(string) string { return "" })
	m.waitReady(t)
	return m
}

// get sends GET /routes/<path> from src and returns the status, body and headers.
func (m *mintServe) get(t *testing.T, src, path string) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+m.proxy+"/routes/"+path, nil)
	return send(t, src, req)
}

// whoami calls the MCP echo upstream's tool from src and returns the result's text.
func (m *mintServe) whoami(t *testing.T, src string) string {
	t.Helper()
	sid := m.session(t, src)
	code, body, _ := m.post(t, src, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`)
	require.Equal(t, http.StatusOK, code, body)
	return body
}

// grant sets (value non-nil) or deletes a grant of a sandbox through the admin API.
func (m *mintServe) grant(t *testing.T, key, name string, value any) {
	t.Helper()
	method, body := http.MethodDelete, []byte(nil)
	if value != nil {
		method = http.MethodPut
		body, _ = json.Marshal(map[string]any{"value": value, "ttl": "1h"})
	}
	req, _ := http.NewRequest(method, "http://"+m.admin+"/v1/grants/"+key+"/"+name, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+m.adminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Less(t, resp.StatusCode, 300, "%s", b)
}

// eventsWhere are the audit events that match.
func (m *mintServe) eventsWhere(t *testing.T, match func(audit.Event) bool) []audit.Event {
	var out []audit.Event
	for _, ev := range m.events(t) {
		if match(ev) {
			out = append(out, ev)
		}
	}
	return out
}

// lifecycle are the credential.* events of kind for the sandbox.
func (m *mintServe) lifecycle(t *testing.T, kind audit.Kind, sandbox string) []audit.Event {
	return m.eventsWhere(t, func(ev audit.Event) bool { return ev.Kind == kind && ev.Identity.Sandbox == sandbox })
}

// waitLifecycle waits until the sandbox has n events of kind and returns them.
func (m *mintServe) waitLifecycle(t *testing.T, kind audit.Kind, sandbox string, n int) []audit.Event {
	t.Helper()
	var evs []audit.Event
	require.Eventually(t, func() bool { evs = m.lifecycle(t, kind, sandbox); return len(evs) >= n },
		20*time.Second, 20*time.Millisecond, "%d %s events of %s", n, kind, sandbox)
	return evs
}

// waitRevoke waits for the credential.revoke event of token (there may be others: a refresh
// that was under way when the run ended is revoked too) and returns it.
func (m *mintServe) waitRevoke(t *testing.T, sandbox, token string) audit.Event {
	t.Helper()
	var found audit.Event
	require.Eventually(t, func() bool {
		for _, ev := range m.eventsWhere(t, func(ev audit.Event) bool {
			return ev.Kind == audit.KindCredentialRevoke && (sandbox == "" || ev.Identity.Sandbox == sandbox)
		}) {
			if ev.CredentialToken != nil && ev.CredentialToken.ID == credential.TokenID(token) {
				found = ev
				return true
			}
		}
		return false
	}, 20*time.Second, 20*time.Millisecond, "the revocation of the run's token is audited")
	return found
}

// bearer is the token in an Authorization value.
func bearer(t *testing.T, auth string) string {
	t.Helper()
	tok, ok := strings.CutPrefix(auth, "Bearer ")
	require.True(t, ok, "the upstream got %q", auth)
	require.NotEmpty(t, tok)
	return tok
}

// assertScrubbed checks that what a sandbox read holds none of token's forms, and the marker
// where the echo was.
func assertScrubbed(t *testing.T, token string, read ...string) {
	t.Helper()
	for _, r := range read {
		for _, f := range respguard.Forms(token) {
			assert.NotContains(t, r, f, "a form of the minted token reached the sandbox")
		}
	}
}

// concurrently sends n GETs of path from src at once and returns their statuses.
func (m *mintServe) concurrently(t *testing.T, n int, src, path string) []int {
	codes := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			req, _ := http.NewRequest(http.MethodGet, "http://"+m.proxy+"/routes/"+path, nil)
			codes[i], _, _, _ = trySendHeader(src, req)
		})
	}
	wg.Wait()
	return codes
}

// metric is the value of the sample whose line starts with prefix on /metrics (0 if none).
func (m *mintServe) metric(t *testing.T, prefix string) float64 {
	resp, err := http.Get("http://" + m.admin + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, prefix) {
			var v float64
			_, _ = fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
			return v
		}
	}
	return 0
}
