package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
)

// serve enforces a bundle built and signed by the real `opa build`, fetched from an HTTP bundle
// service on loopback, with a shadow policy that denies everything beside it: the tool call is
// served, its event names the bundle's revision, and the shadow's divergence is counted.
func TestServeEnforcesASignedBundleWithAShadowThatChangesNothing(t *testing.T) {
	dir := t.TempDir()
	private, public := writeSigningKeys(t, dir)
	bundlePath := filepath.Join(dir, "bundle.tar.gz")
	opaBuild(t, bundlePath, "ship-1", private)
	raw, err := os.ReadFile(bundlePath)
	require.NoError(t, err)
	bundles := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("ETag", `"ship-1"`)
		_, _ = w.Write(raw)
	}))
	t.Cleanup(bundles.Close)
	candidate := filepath.Join(dir, "candidate")
	require.NoError(t, os.Mkdir(candidate, 0o755))
	writeFile(t, candidate, "deny.rego", "package sandgate\n\ndecision := {\"allow\": false, \"reason\": \"candidate denies\", \"code\": \"candidate_denies\"}\n")

	cp := &callPath{mcp: freeAddr(t), proxy: freeAddr(t), admin: freeAddr(t), auditDir: filepath.Join(dir, "audit")}
	cfg := writeFile(t, dir, "sandgate.yaml", fmt.Sprintf(`listen: {mcp: %q, proxy: %q, admin: %q}
policy:
  bundle: {url: %q, public_key_file: %q, algorithm: ES256}
  shadow: {dir: %q}
  decision_log: {file: %q}
audit: {file: {dir: %q, fsync: never}}
shutdown: {delay: 0s}
gateway:
  upstreams:
    - {name: github, url: %q, prefix: never}
identity:
  static:
    - {addresses: [%q], namespace: agents, sandbox: coder-1, template: coding-agent}
log: {level: warn, format: text}
`, cp.mcp, cp.proxy, cp.admin, bundles.URL+"/bundles/sandgate.tar.gz", public, candidate,
		filepath.Join(dir, "decisions.log"), cp.auditDir, richUpstream(t), cpCoder))
	startServe(t, cfg, func(string) string { return "" })
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + cp.admin + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	require.Eventually(t, func() bool { // ready, and the upstream connected (not degraded)
		c, body := get("/readyz")
		return c == http.StatusOK && !strings.Contains(body, "gateway upstreams")
	}, 30*time.Second, 20*time.Millisecond)

	sid := cp.session(t, cpCoder)
	code, body, _ := cp.post(t, cpCoder, sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"get_issue","arguments":{}}}`)
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, "issue 1", "the shadow denies everything, and the call is still served")

	var call *audit.Event
	require.Eventually(t, func() bool {
		for _, ev := range cp.events(t) {
			if ev.Kind == audit.KindToolsCall {
				call = &ev
				return true
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond)
	assert.True(t, call.Decision.Allow)
	assert.Equal(t, "ship-1", call.Decision.PolicyRevision, "the revision is the bundle manifest's")

	divergence := func() bool {
		_, m := get("/metrics")
		for _, line := range strings.Split(m, "\n") {
			if strings.HasPrefix(line, "sandgate_policy_shadow_divergences_total{") && strings.Contains(line, `code="candidate_denies"`) &&
				strings.Contains(line, `kind="mcp.tools_call"`) && strings.HasSuffix(line, " 1") {
				return true
			}
		}
		return false
	}
	require.Eventually(t, divergence, 10*time.Second, 10*time.Millisecond, "the divergence is counted")
}
