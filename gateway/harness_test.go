package gateway

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/credential"
	"github.com/sandgate/sandgate/internal/identity"
	"github.com/sandgate/sandgate/policy"
)

const (
	upstreamSecret = "sekret-upstream-token-0123456789"
	sandboxToken   = "Bearer sandbox-sent-token"
)

// httpUpstream is a real mcp-go Streamable HTTP server on a loopback port that records the
// Authorization headers it receives.
type httpUpstream struct {
	srv          *httptest.Server
	mu           sync.Mutex
	auths        []string
	traceparents []string
}

func (u *httpUpstream) URL() string { return u.srv.URL + "/mcp" }

func (u *httpUpstream) seenAuth() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.auths...)
}

func newUpstreamServer() *server.MCPServer {
	s := server.NewMCPServer("test-upstream", "1", server.WithToolCapabilities(true))
	s.AddTool(mcp.NewTool("echo", mcp.WithString("message", mcp.Required())),
		func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			msg := req.GetString("message", "")
			if msg == "{authorization}" { // a careless upstream: it echoes the credential it got
				msg, _ = ctx.Value(authKey{}).(string)
			}
			return mcp.NewToolResultText(msg), nil
		})
	s.AddTool(mcp.NewTool("add", mcp.WithNumber("a"), mcp.WithNumber("b")),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(strconv.FormatFloat(req.GetFloat("a", 0)+req.GetFloat("b", 0), 'f', -1, 64)), nil
		})
	return s
}

// startHTTPUpstream serves an upstream on addr ("127.0.0.1:0" for any port).
func startHTTPUpstream(t testing.TB, addr string) *httpUpstream {
	t.Helper()
	u := &httpUpstream{}
	mcpSrv := server.NewStreamableHTTPServer(newUpstreamServer(), server.WithStateful(true),
		server.WithHTTPContextFunc(func(ctx context.Context, r *http.Request) context.Context {
			return context.WithValue(ctx, authKey{}, r.Header.Get("Authorization"))
		}))
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	u.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.auths = append(u.auths, r.Header.Get("Authorization"))
		u.traceparents = append(u.traceparents, r.Header.Get("Traceparent"))
		u.mu.Unlock()
		mcpSrv.ServeHTTP(w, r)
	}))
	u.srv.Listener.Close()
	u.srv.Listener = ln
	u.srv.Start()
	t.Cleanup(u.srv.Close)
	return u
}

// buildExampleUpstream builds examples/mcp-upstream into the test's temp folder.
func buildExampleUpstream(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "mcp-upstream")
	cmd := exec.Command("go", "build", "-o", bin, "../examples/mcp-upstream")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build examples/mcp-upstream: %s", out)
	return bin
}

// harness is a gateway on a loopback port with the real policy engine and audit file writer.
type harness struct {
	gw       *Gateway
	addr     string // the MCP listener, served as `sandgate serve` serves it (Gateway.Serve)
	auditDir string
	writer   *audit.Writer
}

func (h *harness) URL() string { return "http://" + h.addr + "/mcp" }

func testIdentities() []identity.StaticEntry {
	return []identity.StaticEntry{
		{Addresses: []string{"127.0.0.1"}, Namespace: "test", Sandbox: "full-1", Template: "full"},
		{Addresses: []string{"127.0.0.2"}, Namespace: "test", Sandbox: "full-2", Template: "full"},
		{Addresses: []string{"127.0.0.3"}, Namespace: "test", Sandbox: "narrow-3", Template: "narrow"},
		// Sandboxes of their own for tests that run several clients side by side.
		{Addresses: []string{"127.0.0.10"}, Namespace: "test", Sandbox: "full-10", Template: "full"},
		{Addresses: []string{"127.0.0.11"}, Namespace: "test", Sandbox: "full-11", Template: "full"},
		{Addresses: []string{"127.0.0.12"}, Namespace: "test", Sandbox: "full-12", Template: "full"},
		{Addresses: []string{"127.0.0.13"}, Namespace: "test", Sandbox: "full-13", Template: "full"},
	}
}

func startGateway(t testing.TB, policyDir string, ups ...config.Upstream) *harness {
	t.Helper()
	return startGatewayWith(t, policyDir, nil, ups...)
}

// startGatewayWith is startGateway with a change to the gateway's Options (nil for none).
func startGatewayWith(t testing.TB, policyDir string, with func(*Options), ups ...config.Upstream) *harness {
	t.Helper()
	ctx := t.Context()
	eng, err := policy.New(ctx, policyDir)
	require.NoError(t, err)
	res, err := identity.NewStatic(testIdentities())
	require.NoError(t, err)
	h := &harness{auditDir: t.TempDir()}
	sink, err := audit.OpenFileSink(audit.FileConfig{Dir: h.auditDir, Fsync: audit.FsyncNever})
	require.NoError(t, err)
	h.writer = audit.NewWriter(sink)
	for i := range ups {
		if ups[i].Prefix == "" {
			ups[i].Prefix = config.PrefixOnConflict
		}
		if ups[i].CallTimeout == 0 {
			ups[i].CallTimeout = config.Duration(20 * time.Second)
		}
		if ups[i].ConnectTimeout == 0 {
			ups[i].ConnectTimeout = config.Duration(5 * time.Second)
		}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if os.Getenv("SANDGATE_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	opts := Options{
		Config:      config.Gateway{Upstreams: ups, MaxBodyBytes: 64 << 10, SessionIdleTimeout: config.Duration(time.Minute)},
		Identity:    res,
		Policy:      eng,
		Audit:       h.writer,
		Credentials: credential.FromValues(map[string]string{"upstream": upstreamSecret}),
		Log:         log,
	}
	if with != nil {
		with(&opts)
	}
	for _, v := range opts.Credentials.Values() {
		sandboxReads.Secret(v)
	}
	gw, err := New(opts)
	require.NoError(t, err)
	gw.Start(ctx)
	h.gw = gw
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ln = sandboxReads.Listener(t.Name(), ln)
	h.addr = ln.Addr().String()
	sctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- gw.Serve(sctx, ln, 5*time.Second) }()
	t.Cleanup(func() {
		stop()
		assert.NoError(t, <-served)
		gw.Close()
		_ = h.writer.Close(context.Background())
	})
	return h
}

// waitReady waits until every upstream is connected.
func (h *harness) waitReady(t testing.TB) {
	t.Helper()
	require.Eventually(t, func() bool { return h.gw.Ready() == nil }, 15*time.Second, 20*time.Millisecond,
		"upstreams not ready: %v", h.gw.Ready())
}

// assertToolCallFailed closes the writer and checks that the tools/call events of tool (at
// least one) say it failed with code and status.
func (h *harness) assertToolCallFailed(t testing.TB, tool, code string, status int) {
	t.Helper()
	var found bool
	for _, ev := range h.auditEvents(t) {
		if ev.Kind == audit.KindToolsCall && ev.Target.Tool == tool {
			found = true
			assert.Equal(t, code, ev.Outcome.Error)
			assert.Equal(t, status, ev.Outcome.Status)
		}
	}
	assert.True(t, found, "the call of %s is audited", tool)
}

// auditEvents closes the writer and reads every event of the file sink.
func (h *harness) auditEvents(t testing.TB) []audit.Event {
	t.Helper()
	require.NoError(t, h.writer.Close(context.Background()))
	f, err := os.Open(filepath.Join(h.auditDir, "audit.log"))
	require.NoError(t, err)
	defer f.Close()
	var evs []audit.Event
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		ev, err := audit.ParseLine(sc.Bytes())
		require.NoError(t, err)
		evs = append(evs, ev)
	}
	return evs
}

// recorder captures every byte the sandbox side reads.
type recorder struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (r *recorder) bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.buf.Bytes())
}

type teeTransport struct {
	base http.RoundTripper
	rec  *recorder
}

func (t teeTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	t.rec.mu.Lock()
	for k, vs := range resp.Header {
		t.rec.buf.WriteString(k + ": ")
		for _, v := range vs {
			t.rec.buf.WriteString(v)
		}
	}
	t.rec.mu.Unlock()
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.TeeReader(resp.Body, lockedWriter{t.rec}), resp.Body}
	return resp, nil
}

type lockedWriter struct{ r *recorder }

func (w lockedWriter) Write(p []byte) (int, error) {
	w.r.mu.Lock()
	defer w.r.mu.Unlock()
	return w.r.buf.Write(p)
}

// sandboxHTTPClient dials from the given loopback source address, playing one sandbox.
func sandboxHTTPClient(src string, rec *recorder) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	var rt http.RoundTripper = &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 16}
	if rec != nil {
		rt = teeTransport{base: rt, rec: rec}
	}
	return &http.Client{Transport: rt}
}

// connectSandbox opens an initialized MCP session from source address src. Every request
// carries a sandbox-sent Authorization header, which must never reach an upstream.
func connectSandbox(t testing.TB, url, src string, rec *recorder) *client.Client {
	t.Helper()
	tr, err := transport.NewStreamableHTTP(url,
		transport.WithHTTPBasicClient(sandboxHTTPClient(src, rec)),
		transport.WithHTTPHeaders(map[string]string{"Authorization": sandboxToken}))
	require.NoError(t, err)
	c := client.NewClient(tr, client.WithProtocolVersion(mcp.LATEST_LEGACY_PROTOCOL_VERSION))
	require.NoError(t, c.Start(t.Context()))
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_LEGACY_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "sandbox-" + src, Version: "1"}
	_, err = c.Initialize(t.Context(), init)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func toolNames(t testing.TB, c *client.Client) []string {
	t.Helper()
	res, err := c.ListTools(t.Context(), mcp.ListToolsRequest{})
	require.NoError(t, err)
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
	}
	return names
}

func callTool(t testing.TB, c *client.Client, name string, args map[string]any) (*mcp.CallToolResult, error) {
	t.Helper()
	req := mcp.CallToolRequest{}
	req.Params.Name = name
	req.Params.Arguments = args
	return c.CallTool(t.Context(), req)
}

func resultText(r *mcp.CallToolResult) string {
	var b bytes.Buffer
	for _, c := range r.Content {
		if tc, ok := c.(mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}
