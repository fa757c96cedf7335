package gateway

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/respguard"
)

// leakyUpstreamEnv makes the test binary, started as a stdio upstream, serve leakyServer
// (TestMain) with the credential it was given in UPSTREAM_TOKEN.
const leakyUpstreamEnv = "SANDGATE_TEST_LEAKY_STDIO_UPSTREAM"

type authKey struct{}

// leakyServer is an upstream that hands back the credential Sandgate gave it, on every channel
// a sandbox reads: a result (raw and in other forms), notifications (whole and in pieces), an
// error, and an oversized message. A tool that sent notifications calls written before it
// returns its result (orderedStdout).
func leakyServer(secretOf func(ctx context.Context) string, written func(n int)) *server.MCPServer {
	s := server.NewMCPServer("leaky", "1", server.WithToolCapabilities(true), server.WithLogging())
	tool := func(name string, h server.ToolHandlerFunc) { s.AddTool(mcp.NewTool(name), h) }
	tool("leak-result", func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("you sent " + secretOf(ctx)), nil
	})
	tool("leak-forms", func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		v := secretOf(ctx)
		return mcp.NewToolResultText(strings.Join([]string{base64.StdEncoding.EncodeToString([]byte(v)),
			hex.EncodeToString([]byte(v)), percentEncoded(v)}, " ")), nil
	})
	tool("leak-notify", func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		v, sent := secretOf(ctx), 0
		if s.SendLogMessageToClient(ctx, mcp.NewLoggingMessageNotification(mcp.LoggingLevelInfo, "leaky", "token "+v)) == nil {
			sent++ // Sandgate asks for every level (debug)
		}
		if m := req.Params.Meta; m != nil && m.ProgressToken != nil {
			if s.SendNotificationToClient(ctx, "notifications/progress",
				map[string]any{"progressToken": m.ProgressToken, "progress": 1, "message": v}) == nil {
				sent++
			}
		}
		written(sent)
		return mcp.NewToolResultText("done"), nil
	})
	tool("leak-pieces", func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		v, sent := secretOf(ctx), 0
		for i := 0; i < len(v); i += 3 {
			if s.SendLogMessageToClient(ctx, mcp.NewLoggingMessageNotification(mcp.LoggingLevelInfo, "leaky", v[i:min(i+3, len(v))])) == nil {
				sent++
			}
		}
		written(sent)
		return mcp.NewToolResultText("done"), nil
	})
	tool("leak-error", func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return nil, errors.New("refused the token " + secretOf(ctx))
	})
	tool("big", func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText(strings.Repeat("x", 2<<20)), nil
	})
	return s
}

func percentEncoded(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

// startLeakyHTTPUpstream serves leakyServer over Streamable HTTP; it echoes the Authorization
// header it got.
func startLeakyHTTPUpstream(t *testing.T) string {
	// mcp-go's HTTP server with an event store writes a call's notifications before its result.
	s := leakyServer(func(ctx context.Context) string { v, _ := ctx.Value(authKey{}).(string); return v }, func(int) {})
	srv := httptest.NewServer(server.NewStreamableHTTPServer(s, server.WithStateful(true),
		server.WithEventStore(server.NewInMemoryEventStore()), server.WithDisableStreaming(true), // noGETStream
		server.WithHTTPContextFunc(func(ctx context.Context, r *http.Request) context.Context {
			return context.WithValue(ctx, authKey{}, r.Header.Get("Authorization"))
		})))
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp"
}

// serveLeakyStdio is the stdio upstream's main.
func serveLeakyStdio() {
	out := newOrderedStdout(os.Stdout)
	s := leakyServer(func(context.Context) string { return os.Getenv("UPSTREAM_TOKEN") }, out.awaitWritten)
	if err := server.NewStdioServer(s).Listen(context.Background(), os.Stdin, out); err != nil {
		os.Exit(1)
	}
	os.Exit(0)
}

// orderedStdout is the stdio leaky server's output. mcp-go's stdio server writes notifications
// from a goroutine of their own, which races the call's response (issue 33 saw the result
// first about half the time): a server whose output Sandgate cannot reorder, since it has not
// read what comes later. The leaky tools wait (awaitWritten) until every notification they
// sent is written, so the server sends them before its result, as a server that keeps one
// order does, and the tests can ask Sandgate to keep that order.
//
// Only the kinds the tools send are counted: mcp-go writes notifications of its own too (the
// notifications/subscriptions/acknowledged that opens Sandgate's 2026-07-28 listening stream,
// written at connect), and counting one made every later wait end a notification early, so
// that the server wrote a call's last notification after its result (issue 35: 5 of 120 runs
// under load).
type orderedStdout struct {
	w     io.Writer
	mu    sync.Mutex
	wrote *sync.Cond
	sent  int // notifications handed to mcp-go
	notes int // notifications of the kinds the tools send, written
}

// toolNotification reports whether p, one message, is a notification the leaky tools send.
func toolNotification(p []byte) bool {
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	return json.Unmarshal(p, &m) == nil && m.ID == nil &&
		(m.Method == string(mcp.MethodNotificationMessage) || m.Method == string(mcp.MethodNotificationProgress))
}

func newOrderedStdout(w io.Writer) *orderedStdout {
	o := &orderedStdout{w: w}
	o.wrote = sync.NewCond(&o.mu)
	return o
}

// Write writes one message (mcp-go writes each whole, newline included).
func (o *orderedStdout) Write(p []byte) (int, error) {
	n, err := o.w.Write(p)
	if toolNotification(p) {
		o.mu.Lock()
		o.notes++
		o.mu.Unlock()
		o.wrote.Broadcast()
	}
	return n, err
}

// awaitWritten waits until the n notifications a tool just sent, and every one before them, are
// written. (A notification mcp-go filtered out would never be: the tools count only what
// Sandgate's level, debug, lets through; the call's timeout bounds the wait anyway.)
func (o *orderedStdout) awaitWritten(n int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.sent += n
	for o.notes < o.sent {
		o.wrote.Wait()
	}
}

// leakyUpstreams are the upstream configurations of the leaky server on both transports, with
// messages bounded at 1 MiB.
func leakyUpstreams(t *testing.T) map[string]config.Upstream {
	exe, err := os.Executable()
	require.NoError(t, err)
	return map[string]config.Upstream{
		"http": {Name: "http", URL: startLeakyHTTPUpstream(t), ProtocolVersion: mcp.LATEST_LEGACY_PROTOCOL_VERSION,
			MaxMessageBytes: 1 << 20, Credential: &config.CredentialRef{Name: "upstream", Header: "Authorization", Format: "Bearer {value}"}},
		"stdio": {Name: "local", Command: exe, Env: map[string]string{leakyUpstreamEnv: "1"},
			MaxMessageBytes: 1 << 20, CredentialEnv: map[string]string{"UPSTREAM_TOKEN": "upstream"}},
	}
}

// Security invariant 1 on the MCP half: an upstream that hands back its credential, on any
// channel and either transport, hands the sandbox none of it, and the event says so.
func TestUpstreamEchoingItsCredentialHandsTheSandboxNone(t *testing.T) {
	for name, up := range leakyUpstreams(t) {
		t.Run(name, func(t *testing.T) {
			h := startGateway(t, "testdata/policy", up)
			h.waitReady(t)
			s := openRawSession(t, h.URL(), "127.0.0.2")
			s.call("logging/setLevel", map[string]any{"level": "debug"})
			read := func(t *testing.T, tool string) (json.RawMessage, []rpcNotification) {
				res, notes := s.callStream("tools/call", map[string]any{"name": tool, "arguments": map[string]any{},
					"_meta": map[string]any{"progressToken": "p"}})
				all, _ := json.Marshal(notes)
				readable := append(append([]byte(nil), res...), all...)
				assert.False(t, respguard.Build([]string{upstreamSecret}, nil).Betrays(readable), "%s", readable)
				return res, notes
			}
			t.Run("in a result", func(t *testing.T) {
				res, _ := read(t, "leak-result")
				assert.Contains(t, string(res), respguard.Marker[:8])
			})
			t.Run("in base64, hex and percent forms", func(t *testing.T) {
				res, _ := read(t, "leak-forms")
				assert.Contains(t, string(res), respguard.Marker[:8])
			})
			// What the upstream sends before its result reaches the sandbox before it, over stdio
			// too (one order): every call's notifications are on its stream.
			withNotes := func(t *testing.T, tool string, want int) []rpcNotification {
				_, notes := read(t, tool)
				require.Len(t, notes, want, "%s: every notification, before the result", tool)
				return notes
			}
			t.Run("in notifications", func(t *testing.T) {
				withNotes(t, "leak-notify", 2)
			})
			t.Run("in pieces across notifications", func(t *testing.T) {
				given := upstreamSecret // as the upstream got it
				if up.Credential != nil {
					given = strings.ReplaceAll(up.Credential.Format, "{value}", upstreamSecret)
				}
				notes := withNotes(t, "leak-pieces", (len(given)+2)/3)
				var joined strings.Builder
				for _, n := range notes {
					joined.WriteString(fmt.Sprint(n.Params["data"]))
				}
				assert.NotContains(t, joined.String(), upstreamSecret[3:], "a sandbox joining the pieces learns at most the first bytes")
			})
			t.Run("in an error", func(t *testing.T) {
				// The upstream's JSON-RPC error is relayed as it wrote it, but for the credential.
				_, rpcErr, _ := s.exchange("tools/call", map[string]any{"name": "leak-error", "arguments": map[string]any{}})
				require.NotNil(t, rpcErr)
				assert.False(t, respguard.Build([]string{upstreamSecret}, nil).Betrays(rpcErr), "%s", rpcErr)
				assert.Contains(t, string(rpcErr), respguard.Marker[:8])
			})
			evs := h.auditEvents(t)
			echoed := 0
			for _, ev := range evs {
				b, _ := json.Marshal(ev)
				assert.NotContains(t, string(b), upstreamSecret, "no event holds the credential")
				if ev.Kind == audit.KindToolsCall && ev.Outcome.CredentialEchoed {
					echoed++
				}
			}
			assert.Equal(t, 5, echoed, "the event of each call says the credential was echoed")
		})
	}
}

// An upstream message over max_message_bytes fails its call (upstream_too_large), on either
// transport, and is never relayed.
func TestOversizedUpstreamMessageIsRefused(t *testing.T) {
	for name, up := range leakyUpstreams(t) {
		t.Run(name, func(t *testing.T) {
			h := startGateway(t, "testdata/policy", up)
			h.waitReady(t)
			c := connectSandbox(t, h.URL(), "127.0.0.2", nil)
			res, err := callTool(t, c, "big", nil)
			require.NoError(t, err)
			assert.True(t, res.IsError)
			assert.Less(t, len(resultText(res)), 1<<20, "the oversized message is not relayed")
			h.assertToolCallFailed(t, "big", "upstream_too_large", http.StatusBadGateway)
		})
	}
}
