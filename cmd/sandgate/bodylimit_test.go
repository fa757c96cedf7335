package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// bodyClient sends one POST of the body in file to url from the sandbox's address, as one kind
// of client does, and returns the status and body it read, or why it read none.
type bodyClient struct {
	name string
	post func(t *testing.T, url, file string, headers map[string]string) (int, string, error)
}

// goClient is net/http's client, from src; chunked sends the body without a length.
func goClient(src string, chunked bool) bodyClient {
	name := "Go net/http"
	if chunked {
		name += ", chunked"
	}
	return bodyClient{name, func(t *testing.T, url, file string, headers map[string]string) (int, string, error) {
		f, err := os.Open(file)
		require.NoError(t, err)
		defer f.Close()
		fi, err := f.Stat()
		require.NoError(t, err)
		req, err := http.NewRequest(http.MethodPost, url, io.MultiReader(f))
		require.NoError(t, err)
		req.ContentLength = fi.Size()
		if chunked {
			req.ContentLength = -1
		}
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		c := &http.Client{Transport: &http.Transport{DialContext: d.DialContext}, Timeout: 30 * time.Second}
		resp, err := c.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}}
}

// sequentialClient writes the whole request, body included, before it reads anything, as
// Python's http.client (requests, the OpenAI and Anthropic Python SDKs' httpx in its sync mode
// alike) does: an answer sent while it writes is only read once the body is out.
func sequentialClient(src string) bodyClient {
	return bodyClient{"a client that reads after sending", func(t *testing.T, url, file string, headers map[string]string) (int, string, error) {
		body, err := os.ReadFile(file)
		require.NoError(t, err)
		req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
		require.NoError(t, err)
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		c, err := d.Dial("tcp", req.URL.Host)
		require.NoError(t, err)
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		if err := req.Write(c); err != nil {
			return 0, "", fmt.Errorf("sending the request: %w", err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), req)
		if err != nil {
			return 0, "", fmt.Errorf("reading the answer: %w", err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}}
}

// curlClient is curl(1), from src.
func curlClient(src string) bodyClient {
	return bodyClient{"curl", func(t *testing.T, url, file string, headers map[string]string) (int, string, error) {
		curl, err := exec.LookPath("curl")
		if err != nil {
			if os.Getenv("SANDGATE_REQUIRE_TOOLS") != "" {
				t.Fatal("curl is not installed (SANDGATE_REQUIRE_TOOLS is set)")
			}
			t.Skip("curl is not installed")
		}
		out := filepath.Join(t.TempDir(), "body")
		args := []string{"-sS", "--interface", src, "--max-time", "30", "-o", out, "-w", "%{http_code}", "--data-binary", "@" + file}
		for k, v := range headers {
			args = append(args, "-H", k+": "+v)
		}
		res, err := exec.Command(curl, append(args, url)...).Output()
		if err != nil {
			var exit *exec.ExitError
			if ok := errorAs(err, &exit); ok {
				return 0, "", fmt.Errorf("curl: %w: %s", err, exit.Stderr)
			}
			return 0, "", err
		}
		var code int
		_, _ = fmt.Sscan(string(res), &code)
		b, _ := os.ReadFile(out)
		return code, string(b), nil
	}}
}

// nodeFetch is Node's fetch (undici), the transport of the MCP TypeScript SDK and of the model
// SDKs.
func nodeFetch() bodyClient {
	return bodyClient{"Node fetch", func(t *testing.T, url, file string, headers map[string]string) (int, string, error) {
		node := repoPath(t, "test/node/node_modules/node/bin/node")
		if _, err := os.Stat(node); err != nil {
			if os.Getenv("SANDGATE_REQUIRE_TOOLS") != "" {
				t.Fatalf("%s: run test/setup.sh (SANDGATE_REQUIRE_TOOLS is set)", node)
			}
			t.Skip("Node 22 is not installed: run test/setup.sh")
		}
		h, _ := json.Marshal(headers)
		// Node's fetch connects from the default address: the sandbox is 127.0.0.1 here.
		script := `
const fs = require('fs');
const [url, file, headers] = process.argv.slice(1);
(async () => {
  try {
    const res = await fetch(url, {method: 'POST', body: fs.readFileSync(file), headers: JSON.parse(headers)});
    process.stdout.write(JSON.stringify({status: res.status, body: await res.text()}));
  } catch (e) {
    process.stdout.write(JSON.stringify({error: String(e) + ' (' + String(e.cause) + ')'}));
  }
})();`
		out, err := exec.Command(node, "-e", script, url, file, string(h)).Output()
		require.NoError(t, err)
		var res struct {
			Status int    `json:"status"`
			Body   string `json:"body"`
			Error  string `json:"error"`
		}
		require.NoError(t, json.Unmarshal(out, &res), "%s", out)
		if res.Error != "" {
			return 0, "", fmt.Errorf("fetch: %s", res.Error)
		}
		return res.Status, res.Body, nil
	}}
}

func errorAs(err error, target **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	if ok {
		*target = e
	}
	return ok
}

// TestABodyOverTheLimitIsAnswered413: a 10 MB tools/call (max_body_bytes is 4 MiB) and a 10 MB
// model request (proxy.limits.body_bytes 4 MiB) get a readable 413 with the refusal, a JSON-RPC
// error on /mcp, from every client, however it sends: the connection is not reset under a
// client still sending its body.
func TestABodyOverTheLimitIsAnswered413(t *testing.T) {
	dir := t.TempDir()
	mcpAddr, proxyAddr, admin := freeAddr(t), freeAddr(t), freeAddr(t)
	writeFile(t, dir, "anthropic", "sk-ant-test-value")
	cfg := writeFile(t, dir, "sandgate.yaml", fmt.Sprintf(`listen: {mcp: %q, proxy: %q, admin: %q}
policy: {dir: %q}
audit: {file: {dir: %q, fsync: never}}
shutdown: {delay: 0s}
credentials:
  - {name: anthropic, file: anthropic}
gateway:
  upstreams:
    - {name: github, url: %q, prefix: never}
proxy:
  routes:
    - {name: anthropic, upstream: %q, api: anthropic, allow_private: true,
       credential: {name: anthropic, header: x-api-key, format: "{value}"}}
identity:
  static:
    - {addresses: ["127.0.0.1"], namespace: agents, sandbox: coder-1, template: coding-agent}
log: {level: warn, format: text}
`, mcpAddr, proxyAddr, admin, repoPath(t, "policies"), filepath.Join(dir, "audit"), githubUpstream(t), modelAPI(t)))
	startServe(t, cfg, func(string) string { return "" })
	operator := &http.Client{Transport: &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.3")}}).DialContext}}
	require.Eventually(t, func() bool {
		resp, err := operator.Get("http://" + admin + "/readyz") // 127.0.0.1 is the sandbox here
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 20*time.Millisecond)

	const src = "127.0.0.1" // Node's fetch has no source address of its own choosing
	big := strings.Repeat("a", 10<<20)
	toolCall := filepath.Join(dir, "tools-call.json")
	require.NoError(t, os.WriteFile(toolCall, []byte(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"get_issue","arguments":{"text":"`+big+`"}}}`), 0o600))
	model := filepath.Join(dir, "messages.json")
	require.NoError(t, os.WriteFile(model, []byte(`{"model":"claude-x","max_tokens":5,"messages":[{"role":"user","content":"`+big+`"}]}`), 0o600))
	session := mcpSessionID(t, mcpAddr, src)

	for _, c := range []bodyClient{goClient(src, false), goClient(src, true), sequentialClient(src), curlClient(src), nodeFetch()} {
		for i := range 3 {
			t.Run(fmt.Sprintf("%s, tools/call, %d", c.name, i+1), func(t *testing.T) {
				status, body, err := c.post(t, "http://"+mcpAddr+"/mcp", toolCall, map[string]string{
					"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
					"Mcp-Session-Id": session, "Mcp-Protocol-Version": "2025-06-18"})
				require.NoError(t, err, "a readable answer, not a reset")
				assert.Equal(t, http.StatusRequestEntityTooLarge, status)
				assert.Contains(t, body, `"data":{"code":"body_too_large"}`)
				assert.Contains(t, body, `"jsonrpc":"2.0"`)
			})
			t.Run(fmt.Sprintf("%s, model request, %d", c.name, i+1), func(t *testing.T) {
				status, body, err := c.post(t, "http://"+proxyAddr+"/routes/anthropic/v1/messages", model,
					map[string]string{"Content-Type": "application/json"})
				require.NoError(t, err, "a readable answer, not a reset")
				assert.Equal(t, http.StatusRequestEntityTooLarge, status)
				assert.Contains(t, body, "body_too_large")
			})
		}
	}
}

// mcpSessionID initializes an MCP session from src and returns its ID.
func mcpSessionID(t *testing.T, addr, src string) string {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c := &http.Client{Transport: &http.Transport{DialContext: d.DialContext}, Timeout: 30 * time.Second}
	post := func(body string, sid string) *http.Response {
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/mcp", bytes.NewReader([]byte(body)))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if sid != "" {
			req.Header.Set("Mcp-Session-Id", sid)
		}
		resp, err := c.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	resp := post(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`, "")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	sid := resp.Header.Get("Mcp-Session-Id")
	require.NotEmpty(t, sid)
	post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`, sid)
	return sid
}
