package gateway

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
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
// error, and an oversized message.
func leakyServer(secretOf func(ctx context.Context) string) *server.MCPServer {
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
		v := secretOf(ctx)
		_ = s.SendLogMessageToClient(ctx, mcp.NewLoggingMessageNotification(mcp.LoggingLevelInfo, "leaky", "token "+v))
		if m := req.Params.Meta; m != nil && m.ProgressToken != nil {
			_ = s.SendNotificationToClient(ctx, "notifications/progress",
				map[string]any{"progressToken": m.ProgressToken, "progress": 1, "message": v})
		}
		return mcp.NewToolResultText("done"), nil
	})
	tool("leak-pieces", func(ctx context.Context, _ mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		v := secretOf(ctx)
		for i := 0; i < len(v); i += 3 {
			_ = s.SendLogMessageToClient(ctx, mcp.NewLoggingMessageNotification(mcp.LoggingLevelInfo, "leaky", v[i:min(i+3, len(v))]))
		}
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
	s := leakyServer(func(ctx context.Context) string { v, _ := ctx.Value(authKey{}).(string); return v })
	srv := httptest.NewServer(server.NewStreamableHTTPServer(s, server.WithStateful(true),
		server.WithEventStore(server.NewInMemoryEventStore()),
		server.WithHTTPContextFunc(func(ctx context.Context, r *http.Request) context.Context {
			return context.WithValue(ctx, authKey{}, r.Header.Get("Authorization"))
		})))
	t.Cleanup(srv.Close)
	return srv.URL + "/mcp"
}

// serveLeakyStdio is the stdio upstream's main.
func serveLeakyStdio() {
	s := leakyServer(func(context.Context) string { return os.Getenv("UPSTREAM_TOKEN") })
	if err := server.ServeStdio(s); err != nil {
		os.Exit(1)
	}
	os.Exit(0)
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
			leaks := 0 // calls whose upstream echoed the credential, each must be flagged
			read := func(t *testing.T, tool string) (json.RawMessage, []rpcNotification) {
				leaks++
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
			// Over stdio mcp-go writes a call's notifications before its result only most of the
			// time (they race it inside mcp-go's server): a call is repeated until they arrive,
			// every reading checked.
			withNotes := func(t *testing.T, tool string, want int) []rpcNotification {
				for range 20 {
					if _, notes := read(t, tool); len(notes) >= want {
						return notes
					}
					leaks-- // the notifications came after the result: not this call's echo
				}
				t.Fatalf("%s: no notification arrived before the result in 20 calls", tool)
				return nil
			}
			t.Run("in notifications", func(t *testing.T) {
				withNotes(t, "leak-notify", 2)
			})
			t.Run("in pieces across notifications", func(t *testing.T) {
				if name == "stdio" {
					// Seen once in a loaded run: the pieces reached the sandbox out of the
					// upstream's order, and the joined view (in arrival order) missed them.
					// Issue 35 ("one order") makes the order the upstream's; until then this
					// reading is not deterministic over stdio.
					t.Skip("issue 35: a stdio upstream's notifications can reach the sandbox out of order")
				}
				notes := withNotes(t, "leak-pieces", (len(upstreamSecret)+2)/3)
				var joined strings.Builder
				for _, n := range notes {
					joined.WriteString(fmt.Sprint(n.Params["data"]))
				}
				assert.NotContains(t, joined.String(), upstreamSecret[3:], "a sandbox joining the pieces learns at most the first bytes")
			})
			t.Run("in an error", func(t *testing.T) {
				res, _ := read(t, "leak-error")
				assert.NotEmpty(t, res)
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
			assert.GreaterOrEqual(t, echoed, leaks, "the events say the credential was echoed")
			assert.GreaterOrEqual(t, leaks, 4)
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
			var found bool
			for _, ev := range h.auditEvents(t) {
				if ev.Kind == audit.KindToolsCall && ev.Target.Tool == "big" {
					found = true
					assert.Equal(t, "upstream_too_large", ev.Outcome.Error)
					assert.Equal(t, http.StatusBadGateway, ev.Outcome.Status)
				}
			}
			assert.True(t, found)
		})
	}
}
