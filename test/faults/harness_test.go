package faults

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/sse"
)

// sandgateBin is the binary TestMain builds once for every scenario.
var sandgateBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sandgate-faults-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sandgateBin = filepath.Join(dir, "sandgate")
	build := exec.Command("go", "build", "-o", sandgateBin, "github.com/sandgate/sandgate/cmd/sandgate")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "faults: build sandgate:", err)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// Sandboxes of every scenario's config (identity.static): each plays from its own loopback
// source address.
const (
	coder1 = "127.0.0.2" // agents/coder-1, template coding-agent
	coder2 = "127.0.0.3" // agents/coder-2, template coding-agent
)

// wait bounds every wait of the suite for something to happen.
const wait = 30 * time.Second

// gate is one "sandgate serve" process, restarted on the same config by restart.
type gate struct {
	t                                  *testing.T
	mcp, proxy, admin, auditDir, logTo string
	cfgPath                            string
	cmd                                *exec.Cmd
	exited                             chan struct{}
	exitCode                           int
	answered                           atomic.Int64 // HTTP answers its sandboxes got (sandbox.post)
}

// startGate runs sandgate with listeners on free loopback ports, the shipped policies and extra
// (YAML lines added to the config: gateway, redis, limits …), and waits until /readyz says ready
// and reports no upstream as degraded (all connected).
func startGate(t *testing.T, extra string) *gate {
	t.Helper()
	policies, err := filepath.Abs("../../policies")
	require.NoError(t, err)
	return startGateOn(t, fmt.Sprintf("{dir: %q}", policies), extra)
}

// startGateOn is startGate with the policy section given (a YAML flow mapping).
func startGateOn(t *testing.T, policy, extra string) *gate {
	t.Helper()
	g := newGate(t, policy, extra)
	g.start()
	g.eventually("sandgate ready with its upstreams connected", func() bool {
		code, body := g.readyz()
		return code == http.StatusOK && !strings.Contains(fmt.Sprint(body["degraded"]), "upstream")
	})
	return g
}

// newGate writes the config of a gate; start runs it.
func newGate(t *testing.T, policy, extra string) *gate {
	t.Helper()
	return newGateIn(t, policy, extra, "")
}

// newGateIn is newGate with the audit folder given ("": one of its own).
func newGateIn(t *testing.T, policy, extra, auditDir string) *gate {
	t.Helper()
	dir := t.TempDir()
	if auditDir == "" {
		auditDir = filepath.Join(dir, "audit")
	}
	g := &gate{t: t, mcp: freeAddr(t), proxy: freeAddr(t), admin: freeAddr(t), auditDir: auditDir, logTo: filepath.Join(dir, "sandgate.log")}
	shutdown := "shutdown: {delay: 0s}\n"
	if strings.Contains(extra, "shutdown:") {
		shutdown = ""
	}
	cfg := fmt.Sprintf(`listen: {mcp: %q, proxy: %q, admin: %q}
policy: %s
audit: {file: {dir: %q, fsync: never}}
%sidentity:
  static:
    - {addresses: [%q], namespace: agents, sandbox: coder-1, template: coding-agent}
    - {addresses: [%q], namespace: agents, sandbox: coder-2, template: coding-agent}
log: {level: info, format: text}
%s`, g.mcp, g.proxy, g.admin, policy, g.auditDir, shutdown, coder1, coder2, extra)
	g.cfgPath = filepath.Join(dir, "sandgate.yaml")
	require.NoError(t, os.WriteFile(g.cfgPath, []byte(cfg), 0o600))
	t.Cleanup(func() {
		if g.cmd == nil {
			return
		}
		_ = g.cmd.Process.Kill()
		<-g.exited
		if t.Failed() {
			b, _ := os.ReadFile(g.logTo)
			t.Logf("sandgate log:\n%s", tail(string(b), 4000))
		}
	})
	return g
}

// start runs the process (again, after an exit), its output appended to the log file.
func (g *gate) start() {
	g.t.Helper()
	logFile, err := os.OpenFile(g.logTo, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	require.NoError(g.t, err)
	defer logFile.Close()
	cmd := exec.Command(sandgateBin, "serve", "--config", g.cfgPath)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(), "SANDGATE_REPLICA=faults")
	require.NoError(g.t, cmd.Start())
	exited := make(chan struct{})
	g.cmd, g.exited = cmd, exited
	go func() {
		_ = cmd.Wait()
		g.exitCode = cmd.ProcessState.ExitCode()
		close(exited)
	}()
}

// eventually polls cond until it holds, for at most wait; the test fails otherwise.
func (g *gate) eventually(what string, cond func() bool) {
	g.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-g.exited:
			g.t.Fatalf("%s: sandgate exited (code %d)", what, g.exitCode)
		case <-ctx.Done():
			g.t.Fatalf("%s: not within %s", what, wait)
		case <-tick.C:
		}
	}
}

// readyz returns /readyz's status and decoded body.
func (g *gate) readyz() (int, map[string]any) {
	resp, err := http.Get("http://" + g.admin + "/readyz")
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	var body map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body
}

// metric returns the value of the Prometheus sample whose line starts with name (labels
// included when given), 0 when there is none.
func (g *gate) metric(name string) float64 {
	g.t.Helper()
	resp, err := http.Get("http://" + g.admin + "/metrics")
	require.NoError(g.t, err)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, name); ok && (strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, "{")) {
			f, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			require.NoError(g.t, err)
			return f
		}
	}
	return 0
}

// terminate sends SIGTERM and waits for the process to exit; it returns the exit code.
func (g *gate) terminate() int {
	g.t.Helper()
	require.NoError(g.t, g.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-g.exited:
	case <-time.After(wait):
		g.t.Fatalf("sandgate did not exit within %s of SIGTERM", wait)
	}
	return g.exitCode
}

// events stops sandgate (SIGTERM: the audit log is flushed) and returns every event it wrote.
func (g *gate) events() []audit.Event {
	g.t.Helper()
	select {
	case <-g.exited:
	default:
		require.Equal(g.t, 0, g.terminate())
	}
	res, err := audit.Query(context.Background(), g.auditDir, audit.Filter{Limit: -1})
	require.NoError(g.t, err)
	return res.Events
}

// requireOneEventPerAnswer checks the audit invariant: one event per request a sandbox got an
// answer to, no more, no fewer.
func (g *gate) requireOneEventPerAnswer(evs []audit.Event) {
	g.t.Helper()
	kinds := map[audit.Kind]int{}
	for _, ev := range evs {
		kinds[ev.Kind]++
	}
	require.Equal(g.t, int(g.answered.Load()), len(evs), "events == answered requests; events by kind: %v", kinds)
}

// sandbox is one MCP session from a sandbox's source address, spoken in plain JSON-RPC over
// HTTP so that every request and answer is counted.
type sandbox struct {
	g       *gate
	client  *http.Client
	session string
	nextID  atomic.Int64
}

// connect opens an MCP session from src (initialize, then notifications/initialized).
func (g *gate) connect(src string) *sandbox {
	g.t.Helper()
	s, err := g.tryConnect(src)
	require.NoError(g.t, err)
	return s
}

// tryConnect is connect that returns its error.
func (g *gate) tryConnect(src string) (*sandbox, error) {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	s := &sandbox{g: g, client: &http.Client{Transport: &http.Transport{DialContext: d.DialContext}, Timeout: wait}}
	res, hdr, err := s.post("initialize", map[string]any{"protocolVersion": "2025-06-18",
		"capabilities": map[string]any{}, "clientInfo": map[string]any{"name": "faults", "version": "1"}})
	if err != nil {
		return nil, err
	}
	if res["result"] == nil {
		return nil, fmt.Errorf("initialize: %v", res)
	}
	s.session = hdr.Get("Mcp-Session-Id")
	if _, _, err = s.post("notifications/initialized", nil); err != nil {
		return nil, err
	}
	return s, nil
}

// call calls a tool; ok is false for a tool error result (a refusal included), and text is
// the result's text. err is a transport or JSON-RPC error.
func (s *sandbox) call(tool string, args map[string]any) (ok bool, text string, err error) {
	res, _, err := s.post("tools/call", map[string]any{"name": tool, "arguments": args})
	if err != nil {
		return false, "", err
	}
	if e, isErr := res["error"]; isErr {
		return false, "", fmt.Errorf("json-rpc error: %v", e)
	}
	var r struct {
		IsError bool `json:"isError"`
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	}
	b, _ := json.Marshal(res["result"])
	if err := json.Unmarshal(b, &r); err != nil {
		return false, "", err
	}
	for _, c := range r.Content {
		text += c.Text
	}
	return !r.IsError, text, nil
}

// post sends one JSON-RPC message (a notification when method starts with "notifications/")
// and returns the answer's message (nil for a notification) and headers.
func (s *sandbox) post(method string, params any) (map[string]any, http.Header, error) {
	msg := map[string]any{"jsonrpc": "2.0", "method": method}
	if params != nil {
		msg["params"] = params
	}
	notification := strings.HasPrefix(method, "notifications/")
	if !notification {
		msg["id"] = s.nextID.Add(1)
	}
	body, _ := json.Marshal(msg)
	req, err := http.NewRequest(http.MethodPost, "http://"+s.g.mcp+"/mcp", bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if s.session != "" {
		req.Header.Set("Mcp-Session-Id", s.session)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	s.g.answered.Add(1) // an answer came, whatever it says
	if err != nil {
		return nil, nil, err
	}
	if notification || resp.StatusCode == http.StatusAccepted {
		return nil, resp.Header, nil
	}
	if resp.StatusCode != http.StatusOK {
		return nil, resp.Header, fmt.Errorf("%s: status %d: %s", method, resp.StatusCode, raw)
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		raw = lastData(raw)
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, resp.Header, fmt.Errorf("%s: decode %q: %w", method, raw, err)
	}
	return out, resp.Header, nil
}

// lastData returns the data of the last event of an SSE body (internal/sse) that carries a
// response (an "id" member; the ones before can be notifications such as progress or log
// messages).
func lastData(body []byte) []byte {
	var last []byte
	rd := sse.NewReader(bytes.NewReader(body), len(body)+1)
	rd.Lenient = true // the stream may end without its last blank line
	for {
		ev, err := rd.Next()
		if err != nil {
			return last
		}
		if bytes.Contains(ev.Data, []byte(`"id"`)) {
			last = ev.Data
		}
	}
}

// logLines returns the lines of sandgate's own log that contain substr.
func (g *gate) logLines(substr string) []string {
	g.t.Helper()
	b, err := os.ReadFile(g.logTo)
	require.NoError(g.t, err)
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return out
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().String()
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

const sigterm = syscall.SIGTERM
