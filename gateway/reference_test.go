package gateway

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	"github.com/stretchr/testify/require"
)

// The MCP servers no one here wrote that the tests run Sandgate against (installed by
// test/setup.sh): the TypeScript SDK's reference server, @modelcontextprotocol/server-everything
// (its toggle-* tools send notifications outside a call; its tools that need sampling,
// elicitation or roots are registered only for a client that declares them), and the Go SDK's
// conformance everything-server (test_trigger_tool_change adds a tool and tells every session).
type referenceServers struct {
	node, tsServer, loopbackOnly, goServer string
}

// references locates the reference servers; a missing one skips the test, or fails it under
// SANDGATE_REQUIRE_TOOLS.
func references(t testing.TB) referenceServers {
	t.Helper()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	r := referenceServers{
		node:         filepath.Join(root, "test/node/node_modules/node/bin/node"),
		tsServer:     filepath.Join(root, "test/node/node_modules/@modelcontextprotocol/server-everything/dist/index.js"),
		loopbackOnly: filepath.Join(root, "test/node/loopback-only.mjs"),
		goServer:     filepath.Join(root, ".tools/bin/everything-server"),
	}
	for _, p := range []string{r.node, r.tsServer, r.loopbackOnly, r.goServer} {
		if _, err := os.Stat(p); err != nil {
			if os.Getenv("SANDGATE_REQUIRE_TOOLS") != "" {
				t.Fatalf("%s is missing (SANDGATE_REQUIRE_TOOLS is set): run test/setup.sh", p)
			}
			t.Skipf("%s is missing: run test/setup.sh (set SANDGATE_REQUIRE_TOOLS=1 to fail instead)", p)
		}
	}
	return r
}

// tsArgs are node's arguments for the TypeScript server over transport ("streamableHttp" or
// "stdio"); loopback-only.mjs binds its HTTP listener to 127.0.0.1.
func (r referenceServers) tsArgs(transport string) []string {
	return []string{"--import", r.loopbackOnly, r.tsServer, transport}
}

// startTS serves the TypeScript server over Streamable HTTP until the test ends.
func (r referenceServers) startTS(t testing.TB) string {
	t.Helper()
	addr := freeLoopbackAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command(r.node, r.tsArgs("streamableHttp")...)
	cmd.Env = append(os.Environ(), "PORT="+port)
	startReferenceServer(t, addr, cmd)
	return "http://" + addr + "/mcp"
}

// startGo serves the Go SDK's conformance server (stateful) until the test ends.
func (r referenceServers) startGo(t testing.TB) string {
	t.Helper()
	addr := freeLoopbackAddr(t)
	startReferenceServer(t, addr, exec.Command(r.goServer, "-http", addr, "-stateless=false"))
	return "http://" + addr + "/mcp"
}

// startReferenceServer starts cmd, an MCP server that listens on addr, until the test ends.
func startReferenceServer(t testing.TB, addr string, cmd *exec.Cmd) {
	t.Helper()
	var logs lockedBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s output:\n%s", filepath.Base(cmd.Path), logs.String())
		}
	})
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 20*time.Second, 20*time.Millisecond, "%s does not listen on %s", cmd.Path, addr)
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// listeningSandbox is a sandbox as the TypeScript SDK's clients are: it keeps its session's GET
// stream open, declares the capabilities it has handlers for (roots, sampling, elicitation),
// and records every notification it receives, on whichever stream.
type listeningSandbox struct {
	*client.Client
	mu    sync.Mutex
	notes []mcp.JSONRPCNotification
	got   chan struct{} // a notification arrived
}

// sandboxOptions are the handlers a listeningSandbox answers server requests with; nil ones
// are capabilities it does not declare.
type sandboxOptions struct {
	roots       client.RootsHandler
	sampling    client.SamplingHandler
	elicitation client.ElicitationHandler
}

func connectListeningSandbox(t testing.TB, url, src string, o sandboxOptions) *listeningSandbox {
	t.Helper()
	//lint:ignore SA1019 a legacy sandbox keeps the session's GET stream open, as TypeScript clients do
	tr, err := transport.NewStreamableHTTP(url, transport.WithHTTPBasicClient(sandboxHTTPClient(src, nil)), transport.WithContinuousListening())
	require.NoError(t, err)
	opts := []client.ClientOption{client.WithProtocolVersion(mcp.LATEST_LEGACY_PROTOCOL_VERSION)}
	if o.roots != nil {
		opts = append(opts, client.WithRootsHandler(o.roots))
	}
	if o.sampling != nil {
		opts = append(opts, client.WithSamplingHandler(o.sampling))
	}
	if o.elicitation != nil {
		opts = append(opts, client.WithElicitationHandler(o.elicitation))
	}
	s := &listeningSandbox{Client: client.NewClient(tr, opts...), got: make(chan struct{}, 1)}
	s.OnNotification(func(n mcp.JSONRPCNotification) {
		s.mu.Lock()
		s.notes = append(s.notes, n)
		s.mu.Unlock()
		select {
		case s.got <- struct{}{}:
		default:
		}
	})
	require.NoError(t, s.Start(t.Context()))
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_LEGACY_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "sandbox-" + src, Version: "1"}
	_, err = s.Initialize(t.Context(), init)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// received is every notification of method the sandbox got so far.
func (s *listeningSandbox) received(method string) []mcp.JSONRPCNotification {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []mcp.JSONRPCNotification
	for _, n := range s.notes {
		if n.Method == method {
			out = append(out, n)
		}
	}
	return out
}

// await waits (up to a generous deadline) until the sandbox got a notification of method.
func (s *listeningSandbox) await(t testing.TB, method string) []mcp.JSONRPCNotification {
	t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		if got := s.received(method); len(got) > 0 {
			return got
		}
		select {
		case <-s.got:
		case <-deadline:
			t.Fatalf("no %s reached the sandbox", method)
		}
	}
}

func (s *listeningSandbox) toolNames(t testing.TB) []string {
	t.Helper()
	res, err := s.ListTools(t.Context(), mcp.ListToolsRequest{})
	require.NoError(t, err)
	var names []string
	for _, tl := range res.Tools {
		names = append(names, tl.Name)
	}
	slices.Sort(names)
	return names
}

// fixedRoots answers roots/list with the roots it holds.
type fixedRoots []mcp.Root

func (r fixedRoots) ListRoots(context.Context, mcp.ListRootsRequest) (*mcp.ListRootsResult, error) {
	return &mcp.ListRootsResult{Roots: r}, nil
}
