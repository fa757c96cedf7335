package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tmpfsEnv carries the mount point to the test re-executed in its own mount namespace.
const tmpfsEnv = "SANDGATE_TEST_TMPFS_DIR"

// inTmpfs runs the calling test again in a private mount namespace (unshare -m) with a tmpfs
// of size on the folder it returns: a real file system that really fills up, gone with the
// namespace. It returns "" in the parent, whose test then ends. It needs root: it skips
// otherwise, and fails under SANDGATE_REQUIRE_TOOLS (CI runs as root). As gateway/auditdisk_test.go.
func inTmpfs(t *testing.T, size string) string {
	t.Helper()
	if dir := os.Getenv(tmpfsEnv); dir != "" {
		require.NoError(t, syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size), "mount a tmpfs on %s", dir)
		return dir
	}
	unshare, err := exec.LookPath("unshare")
	if os.Geteuid() != 0 || err != nil {
		msg := "needs root and unshare(1) to mount a tmpfs in a private mount namespace"
		if os.Getenv("SANDGATE_REQUIRE_TOOLS") != "" {
			t.Fatal(msg + " (SANDGATE_REQUIRE_TOOLS is set)")
		}
		t.Skip(msg)
	}
	dir := t.TempDir()
	cmd := exec.CommandContext(t.Context(), unshare, "-m", "--propagation", "private",
		os.Args[0], "-test.run", "^"+t.Name()+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), tmpfsEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	t.Logf("in a private mount namespace:\n%s", out)
	require.NoError(t, err, "the test failed in its mount namespace")
	require.Contains(t, string(out), "--- PASS: "+t.Name(), "the test ran there")
	return ""
}

// fillDisk writes dir/filler until the file system is full, to its last byte.
func fillDisk(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	require.NoError(t, err)
	defer f.Close()
	chunk := make([]byte, 4096)
	for {
		if _, err := f.Write(chunk); err != nil {
			require.ErrorIs(t, err, syscall.ENOSPC)
			break
		}
	}
	for _, err := f.Write(chunk[:1]); err == nil; _, err = f.Write(chunk[:1]) {
	}
}

// rawExchange sends one request's bytes from src on a connection of its own and reads the
// answer; an error means the connection ended without one.
func rawExchange(t *testing.T, addr, src, request string) (*http.Response, []byte, error) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.WriteString(c, request); err != nil {
		return nil, nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, body, err
}

func post(path, host, contentType, body string, headers ...string) string {
	extra := ""
	for _, h := range headers {
		extra += h + "\r\n"
	}
	return fmt.Sprintf("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: %s\r\nAccept: application/json, text/event-stream\r\n%sContent-Length: %d\r\n\r\n%s",
		path, host, contentType, extra, len(body), body)
}

// TestAFullAuditDiskAnswersEveryRequest: with the audit volume full (a Sandgate started on it
// cannot set its reserve aside), every request on both listeners, whatever would otherwise
// refuse it (a ping or notification without a session, a body that is not JSON, a foreign
// Host, a head that is not HTTP …), is answered 503 audit_unavailable: on /mcp a JSON-RPC error,
// on the proxy the refusal body, never a connection closed without an answer.
func TestAFullAuditDiskAnswersEveryRequest(t *testing.T) {
	mnt := inTmpfs(t, "4m")
	if mnt == "" {
		return
	}
	auditDir := filepath.Join(mnt, "audit")
	require.NoError(t, os.MkdirAll(auditDir, 0o700))
	dir := t.TempDir()
	mcpAddr, proxyAddr, admin := freeAddr(t), freeAddr(t), freeAddr(t)
	writeFile(t, dir, "anthropic", "sk-ant-test-value")
	cfg := writeFile(t, dir, "sandgate.yaml", fmt.Sprintf(`listen: {mcp: %q, proxy: %q, admin: %q}
policy: {dir: %q}
audit: {file: {dir: %q, fsync: never, reserve_mb: 1}}
shutdown: {delay: 0s}
credentials:
  - {name: anthropic, file: anthropic}
gateway: {max_body_bytes: 2048}
proxy:
  limits: {body_bytes: 2048}
  routes:
    - {name: anthropic, upstream: %q, api: anthropic, allow_private: true,
       credential: {name: anthropic, header: x-api-key, format: "{value}"}}
identity:
  static:
    - {addresses: ["127.0.0.2"], namespace: agents, sandbox: coder-1, template: coding-agent}
log: {level: warn, format: text}
`, mcpAddr, proxyAddr, admin, repoPath(t, "policies"), auditDir, modelAPI(t)))
	fillDisk(t, mnt)
	startServe(t, cfg, func(string) string { return "" })
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	}, 30*time.Second, 20*time.Millisecond, "serve started on the full disk, unready")

	const sandbox, stranger = "127.0.0.2", "127.0.0.9"
	ping := `{"jsonrpc":"2.0","id":7,"method":"ping"}`
	big := `{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"x","arguments":{"a":"` + strings.Repeat("a", 10<<10) + `"}}}`
	mcpCases := []struct{ name, src, req string }{
		{"a ping without a session", sandbox, post("/mcp", "localhost", "application/json", ping)},
		{"a notification without a session", sandbox, post("/mcp", "localhost", "application/json", `{"jsonrpc":"2.0","method":"notifications/initialized"}`)},
		{"a body that is not JSON", sandbox, post("/mcp", "localhost", "application/json", "this is not JSON")},
		{"a batch", sandbox, post("/mcp", "localhost", "application/json", "["+ping+"]")},
		{"a body that is not application/json", sandbox, post("/mcp", "localhost", "text/plain", ping)},
		{"a body over max_body_bytes", sandbox, post("/mcp", "localhost", "application/json", big)},
		{"an unknown session", sandbox, post("/mcp", "localhost", "application/json", ping, "Mcp-Session-Id: no-such-session")},
		{"a GET without a session", sandbox, "GET /mcp HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n\r\n"},
		{"a DELETE without a session", sandbox, "DELETE /mcp HTTP/1.1\r\nHost: localhost\r\n\r\n"},
		{"a foreign Host", sandbox, post("/mcp", "evil.example", "application/json", ping)},
		{"a foreign Origin", sandbox, post("/mcp", "localhost", "application/json", ping, "Origin: http://evil.example")},
		{"an unknown caller", stranger, post("/mcp", "localhost", "application/json", ping)},
		{"another path", sandbox, post("/other", "localhost", "application/json", ping)},
		{"an initialize", sandbox, post("/mcp", "localhost", "application/json",
			`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)},
		{"a head that is not HTTP", sandbox, "THIS IS NOT HTTP\r\n\r\n"},
		{"a head with both Content-Length and Transfer-Encoding", sandbox,
			"POST /mcp HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"},
	}
	for _, tc := range mcpCases {
		t.Run("mcp: "+tc.name, func(t *testing.T) {
			resp, body, err := rawExchange(t, mcpAddr, tc.src, tc.req)
			require.NoError(t, err, "answered, not a connection closed")
			assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", body)
			var msg struct {
				Error struct {
					Code int `json:"code"`
					Data struct {
						Code string `json:"code"`
					} `json:"data"`
				} `json:"error"`
			}
			require.NoError(t, json.Unmarshal(body, &msg), "a JSON-RPC error: %s", body)
			assert.Equal(t, "audit_unavailable", msg.Error.Data.Code, "%s", body)
			assert.Equal(t, -32603, msg.Error.Code)
		})
	}

	t.Run("admin: a sandbox on the admin listener", func(t *testing.T) {
		resp, body, err := rawExchange(t, admin, sandbox, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
		require.NoError(t, err, "answered, not a connection closed")
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", body)
		assert.Contains(t, string(body), `"code":"audit_unavailable"`)
	})

	model := `{"model":"claude-x","max_tokens":5,"messages":[]}`
	proxyCases := []struct{ name, src, req string }{
		{"a route request", sandbox, post("/routes/anthropic/v1/messages", "sandgate", "application/json", model)},
		{"a route request over body_bytes", sandbox, post("/routes/anthropic/v1/messages", "sandgate", "application/json", big)},
		{"a path that is no route", sandbox, "GET /nothing HTTP/1.1\r\nHost: sandgate\r\n\r\n"},
		{"a plain forward", sandbox, "GET http://api.anthropic.com/v1/models HTTP/1.1\r\nHost: api.anthropic.com\r\n\r\n"},
		{"a CONNECT", sandbox, "CONNECT api.anthropic.com:443 HTTP/1.1\r\nHost: api.anthropic.com:443\r\n\r\n"},
		{"an unknown caller", stranger, "GET http://api.anthropic.com/v1/models HTTP/1.1\r\nHost: api.anthropic.com\r\n\r\n"},
		{"a head that is not HTTP", sandbox, "THIS IS NOT HTTP\r\n\r\n"},
		{"a head with both Content-Length and Transfer-Encoding", sandbox,
			"POST /routes/anthropic/v1/messages HTTP/1.1\r\nHost: sandgate\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"},
	}
	for _, tc := range proxyCases {
		t.Run("proxy: "+tc.name, func(t *testing.T) {
			resp, body, err := rawExchange(t, proxyAddr, tc.src, tc.req)
			require.NoError(t, err, "answered, not a connection closed")
			assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s", body)
			assert.Contains(t, resp.Header.Get("Proxy-Status"), "audit_unavailable")
			assert.Contains(t, string(body), "audit log unavailable")
		})
	}
}
