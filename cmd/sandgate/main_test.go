package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/policy"
)

// syncBuffer is a bytes.Buffer safe for a command writing while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// runCLI runs one command line in-process and returns its exit code and output.
func runCLI(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut syncBuffer
	code = run(context.Background(), &cliEnv{stdout: &out, stderr: &errOut, getenv: func(k string) string { return env[k] }}, args)
	return code, out.String(), errOut.String()
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

func repoPath(t *testing.T, rel string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("..", "..", rel))
	require.NoError(t, err)
	return p
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

func TestCheckConfig(t *testing.T) {
	dir := t.TempDir()
	emptyDir := t.TempDir()
	good := writeFile(t, dir, "good.yaml", fmt.Sprintf("policy:\n  dir: %s\ncredentials:\n  - name: key\n    env: TEST_KEY\n", repoPath(t, "policies")))
	cases := []struct {
		name     string
		args     []string
		env      map[string]string
		wantCode int
		wantOut  string
	}{
		{"valid config passes", []string{"--config", good}, map[string]string{"TEST_KEY": "sk-secret-value"}, 0, "is valid"},
		{"unset credential variable names the credential, not a value", []string{"--config", good}, nil, 1, "credentials[0] (key): environment variable TEST_KEY is unset or empty"},
		{"field mistake names the field", []string{"--config", writeFile(t, dir, "bad.yaml", "audit:\n  file:\n    fsync: sometimes\n")}, nil, 1, "audit.file.fsync"},
		{"policy that does not compile is reported with its file", []string{"--config", writeFile(t, dir, "badpol.yaml", "policy:\n  dir: "+brokenPolicyDir(t)+"\n")}, nil, 1, "broken.rego:3"},
		{"missing config file", []string{"--config", filepath.Join(dir, "none.yaml")}, nil, 1, "read config"},
		{"example config is valid once make run has written its CA and key", []string{"--config", exampleTree(t)}, nil, 0, "is valid"},
		{"listen port out of range names the field", []string{"--config", writeFile(t, dir, "port.yaml", "listen:\n  mcp: 127.0.0.1:80800\n")}, nil, 1, "listen.mcp: port 80800 out of range 1-65535"},
		{"duration without unit names the field", []string{"--config", writeFile(t, dir, "dur.yaml", "gateway:\n  upstreams:\n    - {name: a, url: http://a, connect_timeout: 5}\n")}, nil, 1,
			`gateway.upstreams[0].connect_timeout: want a duration with a unit such as "500ms" or "5s", got 5`},
		{"missing credential file names the field", []string{"--config", podConfig(t, dir, "cred.yaml", "credentials:\n  - {name: k, file: /nonexistent/k}\n")}, nil, 1,
			"credentials[0].file: /nonexistent/k: no such file or directory"},
		{"CA that does not parse is refused", []string{"--config", podConfig(t, dir, "ca.yaml", fmt.Sprintf("proxy:\n  ca: {cert: %s, key: %s}\n",
			writeFile(t, dir, "ca.crt", "not a certificate"), writeFile(t, dir, "ca.key", "not a key")))}, nil, 1, "proxy.ca: load CA"},
		{"two redis topologies are refused", []string{"--config", writeFile(t, dir, "topo.yaml", "redis:\n  addr: r:6379\n  sentinel: {master_name: m, addrs: ['s:26379']}\n")}, nil, 1,
			"redis: set exactly one of redis.addr, redis.sentinel and redis.cluster"},
		{"redis cluster address names the field", []string{"--config", writeFile(t, dir, "cluster.yaml", "redis:\n  cluster: {addrs: ['c:6379', c]}\n")}, nil, 1,
			`redis.cluster.addrs[1]: "c" is not host:port`},
		{"missing redis CA names the field", []string{"--config", podConfig(t, dir, "redisca.yaml", "redis:\n  addr: r:6379\n  tls: {ca_file: /nonexistent/ca.pem}\n")}, nil, 1,
			"redis.tls.ca_file: /nonexistent/ca.pem: no such file or directory"},
		{"redis CA that is no certificate is refused", []string{"--config", podConfig(t, dir, "redisbadca.yaml", "redis:\n  addr: r:6379\n  tls: {ca_file: "+
			writeFile(t, dir, "redis-ca.pem", "not a certificate")+"}\n")}, nil, 1, "redis.tls.ca_file: " + filepath.Join(dir, "redis-ca.pem") + " holds no PEM certificate"},
		{"offline skips the redis TLS files", []string{"--offline", "--config", writeFile(t, dir, "podredis.yaml", "redis:\n  cluster: {addrs: ['c:6379']}\n  tls: {ca_file: /nonexistent/ca.pem}\n")}, nil, 0, "is valid"},
		{"audit folder that is a file is refused", []string{"--config", podConfig(t, dir, "auditfile.yaml", "audit:\n  file:\n    dir: "+writeFile(t, dir, "afile", "")+"\n")}, nil, 1,
			"audit.file.dir: " + filepath.Join(dir, "afile") + " is a file, not a folder"},
		{"audit folder under a file cannot be created", []string{"--config", podConfig(t, dir, "auditunder.yaml", "audit:\n  file:\n    dir: "+filepath.Join(dir, "afile", "audit")+"\n")}, nil, 1,
			"audit.file.dir: cannot create " + filepath.Join(dir, "afile", "audit") + ": " + filepath.Join(dir, "afile") + " is a file"},
		{"missing policy folder names the field", []string{"--config", writeFile(t, dir, "nopol.yaml", "policy:\n  dir: /nonexistent/policies\n")}, nil, 1,
			"policy.dir: /nonexistent/policies: no such file or directory"},
		{"empty policy folder is refused: serve would never become ready", []string{"--config", writeFile(t, dir, "emptypol.yaml", "policy:\n  dir: "+emptyDir+"\n")}, nil, 1,
			"policy.dir: " + emptyDir + " holds no .rego policy file"},
		{"missing stdio command names the field", []string{"--config", podConfig(t, dir, "cmd.yaml", "gateway:\n  upstreams:\n    - {name: a, command: ./no-such-server}\n")}, nil, 1,
			"gateway.upstreams[0].command: " + filepath.Join(dir, "no-such-server") + ": no such file or directory"},
		{"offline skips what only the pod has", []string{"--offline", "--config", writeFile(t, dir, "pod.yaml", "policy:\n  dir: /nonexistent/policies\n"+
			"credentials:\n  - {name: k, file: /nonexistent/k}\n  - {name: e, env: UNSET_IN_TEST}\nproxy:\n  ca: {cert: /nonexistent/ca.crt, key: /nonexistent/ca.key}\n"+
			"gateway:\n  upstreams:\n    - {name: a, command: /nonexistent/server}\n")}, nil, 0, "is valid (offline: credentials, CA and policies not checked)"},
		{"offline still checks the fields", []string{"--offline", "--config", writeFile(t, dir, "podport.yaml", "listen:\n  proxy: :99999\n")}, nil, 1, "listen.proxy: port 99999 out of range 1-65535"},
		{"audit reserve larger than its volume is refused", []string{"--config", podConfig(t, dir, "reserve.yaml", "audit:\n  file:\n    dir: "+filepath.Join(dir, "audit")+"\n    reserve_mb: 1073741824\n")}, nil, 1,
			"audit.file.reserve_mb: 1073741824 MiB is more than the whole volume holding " + filepath.Join(dir, "audit")},
		{"two listeners on one address are refused", []string{"--offline", "--config", writeFile(t, dir, "twice.yaml", "listen:\n  mcp: ':8080'\n  proxy: 0.0.0.0:8080\n")}, nil, 1,
			`listen.proxy: "0.0.0.0:8080" is the address of listen.mcp too`},
		{"offline still checks the audit folder", []string{"--offline", "--config", writeFile(t, dir, "podaudit.yaml", "audit:\n  file:\n    dir: "+writeFile(t, dir, "bfile", "")+"\n")}, nil, 1, "is a file, not a folder"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, tc.env, append([]string{"serve", "--check-config"}, tc.args...)...)
			assert.Equal(t, tc.wantCode, code, "stderr: %s", errOut)
			assert.Contains(t, out+errOut, tc.wantOut)
			assert.NotContains(t, out+errOut, "sk-secret-value")
		})
	}
}

// podConfig writes a config whose policy folder is the shipped one, followed by rest.
func podConfig(t *testing.T, dir, name, rest string) string {
	t.Helper()
	return writeFile(t, dir, name, "policy:\n  dir: "+repoPath(t, "policies")+"\n"+rest)
}

func TestOfflineNeedsCheckConfig(t *testing.T) {
	code, _, errOut := runCLI(t, nil, "serve", "--offline")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "--offline applies to --check-config only")
}

// exampleTree lays out what `make run` has before it serves examples/sandgate.yaml (the CA, the
// audit keys, the placeholder model-API key under var/ and bin/mcp-upstream) in a temporary
// copy, and returns the config's path.
func exampleTree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "examples"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "var", "secrets"), 0o700))
	require.NoError(t, os.Symlink(repoPath(t, "policies"), filepath.Join(root, "policies")))
	example, err := os.ReadFile(repoPath(t, "examples/sandgate.yaml"))
	require.NoError(t, err)
	cfg := writeFile(t, filepath.Join(root, "examples"), "sandgate.yaml", string(example))
	writeFile(t, filepath.Join(root, "var", "secrets"), "anthropic", "sk-ant-placeholder")
	require.NoError(t, os.MkdirAll(filepath.Join(root, "bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "bin", "mcp-upstream"), []byte("#!/bin/sh\n"), 0o755))
	code, _, errOut := runCLI(t, nil, "ca", "init", "--dir", filepath.Join(root, "var", "ca"))
	require.Equal(t, 0, code, errOut)
	code, _, errOut = runCLI(t, nil, "audit", "keygen", "--dir", filepath.Join(root, "var", "audit-keys"))
	require.Equal(t, 0, code, errOut)
	return cfg
}

func brokenPolicyDir(t *testing.T) string {
	d := t.TempDir()
	writeFile(t, d, "broken.rego", "package sandgate\n\ndecision := {\"allow\": nope}\n")
	return d
}

func TestPolicyCommands(t *testing.T) {
	code, out, errOut := runCLI(t, nil, "policy", "test", repoPath(t, "policies"))
	assert.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "PASS")

	dir := t.TempDir()
	input := writeFile(t, dir, "in.json", `{"kind": "http.request", "identity": {"known": true, "template": "triage-agent"},
		"http": {"route": "anthropic", "model": "claude-sonnet-4-5", "max_tokens": 10}}`)
	code, out, errOut = runCLI(t, nil, "policy", "eval", "--dir", repoPath(t, "policies"), "--input", input)
	assert.Equal(t, 0, code, errOut)
	assert.Contains(t, out, `"allow": false`)
	assert.Contains(t, out, `"code": "model_not_allowed"`)
	assert.Contains(t, out, `model \"claude-sonnet-4-5\" is not allowed`)

	code, _, errOut = runCLI(t, nil, "policy", "eval", "--dir", repoPath(t, "policies"))
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "--input is required")

	failing := t.TempDir()
	writeFile(t, failing, "p.rego", "package sandgate\n\ndecision := {\"allow\": false}\n")
	writeFile(t, failing, "p_test.rego", "package sandgate_test\n\ntest_allows if data.sandgate.decision.allow\n")
	code, _, errOut = runCLI(t, nil, "policy", "test", failing)
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "1 failed")
}

// serve runs on loopback ports, answers health, readiness and metrics, and stops cleanly when
// its context ends (what SIGTERM does).
func TestServeLifecycle(t *testing.T) {
	dir := t.TempDir()
	admin := freeAddr(t)
	cfg := writeFile(t, dir, "sandgate.yaml", fmt.Sprintf(`listen:
  admin: %s
policy:
  dir: %s
audit:
  file:
    dir: %s
shutdown:
  delay: 0s
identity:
  static:
    - addresses: ["127.0.0.2"]
      sandbox: coder
      template: coding-agent
`, admin, repoPath(t, "policies"), filepath.Join(dir, "audit")))

	ctx, cancel := context.WithCancel(context.Background())
	var errOut syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, &cliEnv{stdout: io.Discard, stderr: &errOut, getenv: func(string) string { return "" }}, []string{"serve", "--config", cfg})
	}()
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + admin + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	require.Eventually(t, func() bool { c, _ := get("/healthz"); return c == 200 }, 10*time.Second, 20*time.Millisecond, errOut.String())
	code, body := get("/readyz")
	assert.Equal(t, 200, code, body)
	assert.Contains(t, body, `"ready":true`)
	code, body = get("/metrics")
	assert.Equal(t, 200, code)
	assert.Contains(t, body, `sandgate_policy_reloads_total{result="ok"} 1`)
	assert.Contains(t, body, "sandgate_policy_revision_info")
	code, _ = get("/debug/pprof/")
	assert.Equal(t, http.StatusNotFound, code, "the profiler is off unless admin.pprof is set")

	cancel()
	select {
	case c := <-done:
		assert.Equal(t, 0, c, errOut.String())
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop after its context ended")
	}
	assert.True(t, strings.Contains(errOut.String(), "sandgate stopped"), errOut.String())
}

func TestServeProfilerOnlyWhenAsked(t *testing.T) {
	dir := t.TempDir()
	admin := freeAddr(t)
	cfg := writeFile(t, dir, "sandgate.yaml", fmt.Sprintf("listen:\n  admin: %s\nadmin:\n  pprof: true\nshutdown:\n  delay: 0s\npolicy:\n  dir: %s\naudit:\n  file:\n    dir: %s\n",
		admin, repoPath(t, "policies"), filepath.Join(dir, "audit")))
	startServe(t, cfg, func(string) string { return "" })
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + admin + "/debug/pprof/cmdline")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond)
}

// startServe runs serve in process with cfg and getenv until the test ends.
// pinnedClock is the budgets' clock of the servers tests start: 30 s into a minute, for ever,
// so that a requests-per-minute window never rolls over in the middle of a case (the tests
// waited for a fresh minute on the real clock before, up to 15 s).
func pinnedClock() time.Time { return time.Date(2026, 12, 1, 12, 0, 30, 0, time.UTC) }

func startServe(t *testing.T, cfg string, getenv func(string) string) {
	t.Helper()
	// shutdown.delay keeps a stopping serve answering for 5 s by default (Kubernetes rollouts);
	// a test's serve that keeps it spends those 5 s idle in its cleanup, every time.
	if b, err := os.ReadFile(cfg); err != nil || !strings.Contains(string(b), "shutdown:") {
		t.Fatalf("%s: a test's config sets shutdown.delay (0s unless the test is about it) (%v)", cfg, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var errOut syncBuffer // serve's log, shown when the test fails: why a listener was not there
	go func() {
		done <- run(ctx, &cliEnv{stdout: io.Discard, stderr: &errOut, getenv: getenv, now: pinnedClock}, []string{"serve", "--config", cfg})
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; t.Failed() {
			t.Logf("serve exited %d; its log ends:\n%s", code, tail(errOut.String(), 4000))
		}
	})
}

// `policy eval` prints the revision the server writes into audit events (policy_revision),
// however the folder is named: relative, absolute, or through a config file.
func TestPolicyEvalRevisionIsTheServersRevision(t *testing.T) {
	input := writeFile(t, t.TempDir(), "in.json", `{"kind": "mcp.tools_list", "identity": {"known": false}}`)
	abs := repoPath(t, "policies")
	served, err := policy.New(context.Background(), abs)
	require.NoError(t, err)
	cfg := writeFile(t, t.TempDir(), "sandgate.yaml", "policy:\n  dir: "+abs+"\n")

	t.Chdir(filepath.Dir(abs))
	for _, args := range [][]string{
		{"--dir", "policies"},
		{"--dir", "./policies/"},
		{"--dir", abs},
		{"--config", cfg},
	} {
		code, out, errOut := runCLI(t, nil, append([]string{"policy", "eval", "--input", input}, args...)...)
		require.Equal(t, 0, code, errOut)
		var got struct{ Revision string }
		require.NoError(t, json.Unmarshal([]byte(out), &got), out)
		assert.Equal(t, served.Revision(), got.Revision, "policy eval %v", args)
	}
}

// A policy reload that fails leaves the replica ready (the last good revision serves) but says
// so: /readyz reports "policy":"degraded" with the error, /metrics counts the failure by reason.
// A repaired folder makes it "ok" again.
func TestReadyzReportsAPolicyReloadFailure(t *testing.T) {
	dir := t.TempDir()
	policies := filepath.Join(dir, "policies")
	require.NoError(t, os.Mkdir(policies, 0o755))
	writeFile(t, policies, "p.rego", "package sandgate\n\ndecision := {\"allow\": false, \"reason\": \"v1\"}\n")
	admin := freeAddr(t)
	cfg := writeFile(t, dir, "sandgate.yaml", fmt.Sprintf("listen:\n  admin: %s\nshutdown:\n  delay: 0s\npolicy:\n  dir: %s\naudit:\n  file:\n    dir: %s\n",
		admin, policies, filepath.Join(dir, "audit")))
	startServe(t, cfg, func(string) string { return "" })
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + admin + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	type readyz struct {
		Ready          bool              `json:"ready"`
		Policy         string            `json:"policy"`
		PolicyRevision string            `json:"policy_revision"`
		Degraded       map[string]string `json:"degraded"`
	}
	// The reload runs in the server: poll /readyz until it shows the state, with a generous bound.
	waitReadyz := func(what string, cond func(readyz) bool) readyz {
		t.Helper()
		var last readyz
		require.Eventually(t, func() bool {
			code, body := get("/readyz")
			last = readyz{}
			return code == http.StatusOK && json.Unmarshal([]byte(body), &last) == nil && cond(last)
		}, 15*time.Second, 20*time.Millisecond, "%s; last /readyz: %+v", what, last)
		return last
	}
	good := waitReadyz("ready with the policy ok", func(r readyz) bool { return r.Ready && r.Policy == "ok" })

	writeFile(t, policies, "p.rego", "package sandgate\n\ndecision := {\"allow\": \n")
	r := waitReadyz("ready but degraded after a broken edit", func(r readyz) bool { return r.Ready && r.Policy == "degraded" })
	assert.Equal(t, good.PolicyRevision, r.PolicyRevision, "the last good revision serves")
	assert.Contains(t, r.Degraded["policy"], "p.rego:4: rego_parse_error")
	_, metrics := get("/metrics")
	assert.Contains(t, metrics, `sandgate_policy_reload_failures_total{reason="compile"}`)
	assert.Contains(t, metrics, "sandgate_policy_reload_degraded 1")
	assert.Contains(t, metrics, "sandgate_policy_revision_age_seconds ")
	assert.Contains(t, metrics, "sandgate_policy_reload_last_success_seconds ")

	writeFile(t, policies, "p.rego", "package sandgate\n\ndecision := {\"allow\": false, \"reason\": \"v2\"}\n")
	r = waitReadyz("ok again after the repair", func(r readyz) bool { return r.Ready && r.Policy == "ok" })
	assert.NotEqual(t, good.PolicyRevision, r.PolicyRevision)
	assert.Empty(t, r.Degraded)
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
